"""The LLM endpoint's whole capacity plan, from the GPU budget to the fleet, in one object.

:func:`llm_capacity` is what the stacks, the simulator's and the cost report's inputs and
``python -m capacity_model`` all call: the GPU budget's plan, the request mix, the decode-speed
profile and the latency SLOs give one instance's capacity (:mod:`capacity_model.instance`); that,
the daily traffic profile and the policy's shape give the fleet's numbers
(:mod:`capacity_model.fleet`); and the long-conversation options answer "60 per GPU"
(docs/design-decisions.md#conversations-per-gpu, :mod:`capacity_model.conversations`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from capacity_model.conversations import ConversationOption, conversation_options
from capacity_model.decode_speed import DecodeSpeedTable
from capacity_model.demand import ContextWindow, Conversation, RequestMix
from capacity_model.fleet import (
    DailyProfile,
    FleetPlan,
    FleetPolicy,
    InstanceLoad,
    Surge,
    fleet_plan,
)
from capacity_model.instance import InstanceCapacity, LatencySlo, instance_capacity
from gpu_budget import MemoryPlan


@dataclass(frozen=True)
class LlmCapacity:
    """One LLM endpoint's capacity plan and the inputs it was derived from."""

    memory_plan: MemoryPlan
    mix: RequestMix
    window: ContextWindow
    slo: LatencySlo
    instance: InstanceCapacity
    fleet: FleetPlan
    conversation: Conversation
    conversations_wanted: int
    conversation_options: tuple[ConversationOption, ...]
    load: InstanceLoad
    policy: FleetPolicy
    profile: DailyProfile

    def fleet_for(self, surge: Surge, *, provisioning_s: int | None = None) -> FleetPlan:
        """The fleet plan that absorbs ``surge`` unaided (its recommended headroom), with new
        instances serving after ``provisioning_s`` (default: the policy's)."""
        policy = replace(self.policy, unplanned_surge=surge,
                         provisioning_s=(self.policy.provisioning_s if provisioning_s is None
                                         else provisioning_s))
        return fleet_plan(self.load, policy, self.profile)

    @property
    def configured_conversations(self) -> ConversationOption:
        """The option "as configured"."""
        return self.conversation_options[0]

    def gateway_environment(self) -> dict[str, str]:
        """What the gateway must be told so that it admits exactly what this plan sized."""
        return {
            "GATEWAY_BUCKET_CAPS": self.instance.gateway_bucket_caps(),
            "GATEWAY_ADMISSION_WATERMARK": f"{self.instance.admission_watermark:g}",
            "GATEWAY_CONTEXT_SPLIT": self.window.as_env(),
            "GATEWAY_CONTEXT_STEP_TURNS": str(self.window.step_turns),
            # Admission serves what its first-token forecast puts within the TTFT SLO.
            "GATEWAY_TTFT_SLO_S": f"{self.slo.time_to_first_token_p99_ms / 1000:g}",
        }

    def template_metadata(self) -> dict[str, Any]:
        """The figures the simulator and the cost report read back from the template."""
        return {
            "per_instance_invocations_per_min": self.fleet.per_instance_invocations_per_min,
            "concurrency_per_instance": self.instance.concurrency,
            "request_seconds": self.instance.request_seconds,
            "headroom": self.fleet.headroom,
            "target_invocations_per_instance_per_min":
                self.fleet.target_invocations_per_instance_per_min,
            "decode_status": self.instance.decode_status,
            "source": self.fleet.source,
        }


def llm_capacity(
    *,
    plan: MemoryPlan,
    replan: Callable[..., MemoryPlan],
    mix: RequestMix,
    window: ContextWindow,
    table: DecodeSpeedTable,
    slo: LatencySlo,
    admission_watermark: float,
    policy: FleetPolicy,
    profile: DailyProfile,
    conversation: Conversation,
    conversations_wanted: int,
) -> LlmCapacity:
    """Derive the plan (see the module docstring); errors name the input that fails."""
    decode = table.lookup(plan.gpu_model, plan.model_name, plan.quantization,
                          plan.kv_cache_dtype)
    instance = instance_capacity(plan, mix, decode, slo, admission_watermark=admission_watermark)
    load = InstanceLoad(
        sustainable_invocations_per_min=instance.sustainable_invocations_per_min,
        concurrency=instance.concurrency,
        source=(f"capacity model: {instance.concurrency} requests in flight "
                f"({instance.limited_by}) × 60 ÷ {instance.request_seconds:.2f} s per request "
                f"on {plan.instance_type} ({decode.status} decode speed)"),
    )
    return LlmCapacity(
        memory_plan=plan, mix=mix, window=window, slo=slo, instance=instance,
        fleet=fleet_plan(load, policy, profile), load=load, policy=policy, profile=profile,
        conversation=conversation,
        conversations_wanted=conversations_wanted,
        conversation_options=conversation_options(
            plan=plan, replan=replan, conversation=conversation, window=window, mix=mix,
            table=table, admission_watermark=admission_watermark, wanted=conversations_wanted),
    )
