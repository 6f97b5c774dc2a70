"""Settings of the vLLM endpoint: the base model and its adapters, the engine overrides, the context
window, the capacity model's inputs, and the views the GPU budget and the capacity model read."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from capacity_model import (
    BucketDemand,
    ContextWindow,
    Conversation,
    DecodeSpeedTable,
    LatencySlo,
    LlmCapacity,
    ReuseInputs,
    llm_capacity,
    parse_decode_table,
    request_mix,
)
from gpu_budget import MemoryPlan, instance_type, parse_quantization, plan
from gpu_budget.engine_args import DEFAULT_BLOCK_SIZE, ENGINE_ARG
from intents import INTENT_LABELS
from request_buckets import BucketName, RequestBucket, bucket_bounds
from serving_contract import BASE_ROUTE, RESERVED_NAMES, SERVED_MODEL_NAME_PATTERN
from serving_contract.environment import (
    DEFAULT_CONTEXT_SPLIT,
    GATEWAY_ADMISSION_WATERMARK,
    GATEWAY_CONTEXT_STEP_TURNS,
    GATEWAY_SETTING,
    ContextSplit,
    context_split_problems,
)
from stacks.settings.aws import deployment_problem
from stacks.settings.base import (
    CONFIG_DIR,
    REPO_ROOT,
    AdapterName,
    FolderName,
    LocaleTag,
    RepoRelativePath,
    S3Prefix,
    StrictModel,
)
from stacks.settings.deployment import DeploymentSettings
from stacks.settings.endpoint import EndpointAlarmSettings, HealthCheckSettings
from stacks.settings.scaling import ScalingSettings


def _engine_table_choice(name: str, value: int) -> int:
    """``value`` if the engine-argument table's row ``name`` accepts it, else ValueError."""
    choices = ENGINE_ARG[name].choices
    if value not in choices:
        raise ValueError(f"must be one of {', '.join(map(str, choices))}")
    return value


def _contract_field(env: str, kind: type[int] | type[float], *, description: str) -> Any:
    """A field set like the gateway's ``env``: the contract's default and bounds
    (serving_contract/environment.py), so the stack cannot send a value the container refuses."""
    spec = GATEWAY_SETTING[env]
    bounds = spec.bounds
    if spec.default is None or bounds is None or bounds.high is None:
        raise ValueError(f"{env}: the contract gives it no default or no bounds")
    low, high = _plain(bounds.low), _plain(bounds.high)
    return Field(kind(spec.default), description=description,
                 gt=low if bounds.low_open else None, ge=None if bounds.low_open else low,
                 lt=high if bounds.high_open else None, le=None if bounds.high_open else high)


def _plain(bound: float) -> float:
    """A whole-number bound as an int (``ge=1``, not ``ge=1.0``)."""
    return int(bound) if float(bound).is_integer() else bound


class LoraAdapterSettings(StrictModel):
    """One LoRA adapter served on the shared base model."""

    name: AdapterName = Field(description="Name clients put in `model` (vLLM's convention).")
    directory: FolderName | None = Field(
        None, description="Folder under <artifact_prefix>/adapters/ (default: the name)."
    )
    rank: int = Field(description="LoRA rank r of the adapter (vLLM accepts 1, 8, 16, ... 512).")

    @property
    def folder(self) -> str:
        """Folder name under ``adapters/`` in the model data."""
        return self.directory or self.name

    @field_validator("rank")
    @classmethod
    def _vllm_rank(cls, value: int) -> int:
        return _engine_table_choice("max_lora_rank", value)


class BaseModelSettings(StrictModel):
    """The served base model: its architecture (for the GPU budget) and where its weights are."""

    config: RepoRelativePath = Field(
        description="Hugging Face config.json of the model, relative to the repo root."
    )
    quantization: str = Field(
        description="Checkpoint format: bf16, fp16, int8, awq, awq-g64, w4a16, w4a16-g64."
    )
    served_model_name: Annotated[str, StringConstraints(pattern=SERVED_MODEL_NAME_PATTERN.pattern)]
    base_model: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")] = Field(
        description="Hugging Face id of the model the weights were quantized from and the LoRA "
        "adapters trained on (e.g. meta-llama/Meta-Llama-3-8B-Instruct); `make publish` refuses "
        "an adapter whose adapter_config.json names another base model."
    )
    artifact_prefix: S3Prefix = Field(
        description="Prefix in the artifact bucket holding the weights and tokenizer; LoRA "
        "adapters live under <prefix>/adapters/<name>/."
    )

    @field_validator("config")
    @classmethod
    def _config_exists(cls, value: str) -> str:
        if not (REPO_ROOT / value).is_file():
            available = sorted(
                str(p.relative_to(REPO_ROOT)) for p in (CONFIG_DIR / "models").glob("*.json")
            )
            raise ValueError(f"no such file; available: {', '.join(available)}")
        return value

    @field_validator("quantization")
    @classmethod
    def _known_quantization(cls, value: str) -> str:
        parse_quantization(value)
        return value


class EngineOverrides(StrictModel):
    """Engine settings a person may pin; the GPU budget still checks that they fit. Bounds are
    the engine-argument table's (gpu_budget/engine_args.py)."""

    gpu_memory_utilization: float | None = Field(
        None, gt=ENGINE_ARG["gpu_memory_utilization"].minimum,
        le=ENGINE_ARG["gpu_memory_utilization"].maximum,
        description="Unset: the SKU rule (docs/design-decisions.md#gpu-memory-utilization-by-sku).",
    )
    max_num_seqs: int | None = Field(None, ge=1, le=4096)
    max_num_batched_tokens: int | None = Field(None, ge=16, le=131072)
    enable_prefix_caching: bool = Field(True, description="Reuse the system prompt's KV blocks.")
    enforce_eager: bool = Field(False, description="Skip CUDA graphs (slower; frees memory).")
    max_num_queued_reqs: int | None = Field(
        None, ge=1, description="vLLM answers 503 past this queue length (None: unbounded)."
    )


class ContextWindowSettings(StrictModel):
    """Shares of ``max_model_len`` the gateway gives each part of a prompt, and the default
    ``max_tokens`` (``GATEWAY_CONTEXT_SPLIT``). Seed 001: 512 system + 1,024 retrieved context +
    2,048 history + 512 output of a 4,096 window."""

    system: float = DEFAULT_CONTEXT_SPLIT.system
    rag: float = DEFAULT_CONTEXT_SPLIT.rag
    history: float = DEFAULT_CONTEXT_SPLIT.history
    output: float = DEFAULT_CONTEXT_SPLIT.output
    step_turns: int = _contract_field(
        GATEWAY_CONTEXT_STEP_TURNS, int,
        description="Turns of the conversation's average size each step of the sliding window "
        "makes room for (GATEWAY_CONTEXT_STEP_TURNS; docs/design-decisions.md"
        "#prefix-stable-window).")

    @model_validator(mode="after")
    def _within_the_window(self) -> ContextWindowSettings:
        split = ContextSplit(self.system, self.rag, self.history, self.output)
        problems = context_split_problems(split)  # the contract's one check
        if problems:
            raise ValueError("; ".join(problems))
        return self


class BucketDemandSettings(StrictModel):
    """The typical request of one bucket and its share of all requests."""

    share: float = Field(ge=0, le=1)
    prompt_tokens: int = Field(ge=1)
    max_tokens: int = Field(ge=1)
    output_tokens: int = Field(ge=1, description="Tokens generated, on average.")
    system_tokens: int = Field(
        0, ge=0, description="Of the prompt: the product's system prompt (always cached).")
    history_tokens: int = Field(
        0, ge=0, description="Of the prompt: earlier turns of the conversation (cached as far "
        "as the window, sessions and eviction allow; docs/capacity.md).")


class ConversationSettings(StrictModel):
    """The long conversation the requirements ask 60 of per GPU
    (docs/design-decisions.md#conversations-per-gpu)."""

    turns: int = Field(30, ge=1, le=1000)
    tokens_per_turn: int = Field(
        100, ge=1,
        description="~100 tokens a turn (docs/design-decisions.md#conversations-per-gpu).")
    system_tokens: int = Field(512, ge=0)
    rag_tokens: int = Field(1024, ge=0)
    rag_chunks: int = Field(4, ge=1, description="Retrieved chunks (the gateway keeps whole ones).")
    concurrent_wanted: int = Field(60, ge=1, description="Seed 001 story 1: >= 60 per GPU.")
    think_time_s: float = Field(
        45, gt=0, le=3600,
        description="Mean time from the end of an answer to the customer's next message: how "
        "long a conversation's cached prefix must survive (docs/capacity.md).")


class RateChoiceSettings(StrictModel):
    """Which end of the GPU's rate ranges the fleet is sized at (config/decode_speed.json
    ``rates``). Every environment sizes at ``central``; the cost report prices the others."""

    scenario: Literal["pessimistic", "central", "optimistic"] = "central"
    prefill_factor: float = Field(
        1.0, gt=0, le=10,
        description="Multiplies the scenario's prefill rate (the cost report's sensitivity).")


class LlmCapacitySettings(StrictModel):
    """Inputs of the capacity model for the LLM endpoint (none of them a capacity figure)."""

    decode_speed_file: RepoRelativePath = Field(
        "config/decode_speed.json",
        description="The decode-speed table: TTFT and TPOT by batch size per GPU and model.",
    )
    request_mix: dict[BucketName, BucketDemandSettings] = Field(
        description="Share and typical request of each request-size bucket (request_buckets)."
    )
    admission_watermark: float = _contract_field(
        GATEWAY_ADMISSION_WATERMARK, float,
        description="Share of the KV pool one request may be expected to hold at its end "
        "(GATEWAY_ADMISSION_WATERMARK; more never fits), and the share the capacity model sizes "
        "the bucket caps and the KV limit within (each request at prompt + max_tokens).",
    )
    conversation: ConversationSettings = Field(default_factory=ConversationSettings)
    rates: RateChoiceSettings = Field(default_factory=RateChoiceSettings)
    sessions: bool = Field(
        True, description="The gateway pins a conversation's turns to one instance with "
        "SageMaker stateful sessions (its prefix cache stays useful); False: every request is "
        "routed by least outstanding requests.")

    @field_validator("decode_speed_file")
    @classmethod
    def _exists(cls, value: str) -> str:
        if not (REPO_ROOT / value).is_file():
            raise ValueError("no such file")
        return value


class LlmEndpointSettings(StrictModel):
    """The vLLM endpoint: model, instance, context window, adapters, health and deployment."""

    instance_type: str = Field("ml.g5.xlarge", description="A GPU instance of the catalog.")
    model: BaseModelSettings
    max_model_len: int = Field(4096, ge=256, le=131072)
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    block_size: int = Field(DEFAULT_BLOCK_SIZE,
                            description="Tokens per KV block: one of the engine table's sizes.")
    engine: EngineOverrides = Field(default_factory=EngineOverrides)
    adapters: list[LoraAdapterSettings] = Field(default_factory=list)
    max_loras: int | None = Field(
        None, ge=1, le=64, description="Adapters per batch (default: all of them)."
    )
    routing: dict[str, AdapterName] = Field(
        default_factory=dict,
        description="intent -> adapter name (or 'base') when a request names no model.",
    )
    locale_routes: dict[LocaleTag, dict[AdapterName, AdapterName]] = Field(
        default_factory=dict,
        description="locale -> {adapter picked by intent: adapter to use instead}.",
    )
    health: HealthCheckSettings = Field(default_factory=HealthCheckSettings)
    deployment: DeploymentSettings = Field(default_factory=DeploymentSettings)
    routing_strategy: Literal["least_outstanding", "prefix_aware"] = Field(
        "least_outstanding", description="How SageMaker routes requests to instances: "
        "least_outstanding (LEAST_OUTSTANDING_REQUESTS, with capacity.sessions pinning "
        "conversations) or prefix_aware (PREFIX_AWARE: PrefixLength from the system prompt and "
        "the conversation's start, ConcurrencyThreshold the plan's in-flight cap; needs "
        "capacity.sessions false). docs/scaling.md#prefix-aware-routing weighs them.")
    context_window: ContextWindowSettings = Field(default_factory=ContextWindowSettings)
    capacity: LlmCapacitySettings
    scaling: ScalingSettings
    alarms: EndpointAlarmSettings = Field(default_factory=EndpointAlarmSettings)

    @field_validator("block_size")
    @classmethod
    def _engine_block_size(cls, value: int) -> int:
        return _engine_table_choice("block_size", value)

    @field_validator("instance_type")
    @classmethod
    def _gpu_instance(cls, value: str) -> str:
        kind = instance_type(value).accelerator_kind
        if kind != "gpu":
            raise ValueError(f"is an {kind} instance; the vLLM endpoint needs a GPU instance")
        return value

    @field_validator("routing")
    @classmethod
    def _known_intents(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - set(INTENT_LABELS))
        if unknown:
            raise ValueError(
                f"unknown intent(s) {', '.join(unknown)}; accepted: {', '.join(INTENT_LABELS)}"
            )
        return value

    @model_validator(mode="after")
    def _adapters_consistent(self) -> LlmEndpointSettings:
        names = [adapter.name for adapter in self.adapters]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"adapters: name {duplicates[0]!r} is used twice")
        reserved = sorted(RESERVED_NAMES & {*names, self.model.served_model_name})
        if reserved:
            raise ValueError(f"adapters: {reserved[0]!r} is reserved (model={reserved[0]!r} "
                             "means something else); accepted: any other name")
        if self.model.served_model_name in names:
            raise ValueError(f"adapters: {self.model.served_model_name!r} is the base model's "
                             "served name; accepted: a name of its own")
        served = {*names, BASE_ROUTE}
        for intent, target in self.routing.items():
            if target not in served:
                raise ValueError(
                    f"routing.{intent}: {target!r} is not a configured adapter; accepted: "
                    f"{', '.join(sorted(served))}"
                )
        for locale, table in self.locale_routes.items():
            for source, target in table.items():
                for name in (source, target):
                    if name not in names:
                        raise ValueError(
                            f"locale_routes.{locale}: {name!r} is not a configured adapter; "
                            f"accepted: {', '.join(sorted(names))}"
                        )
        if self.max_loras is not None and self.max_loras > len(self.adapters):
            raise ValueError(
                f"max_loras: {self.max_loras} is more than the {len(self.adapters)} configured "
                "adapters"
            )
        return self

    @model_validator(mode="after")
    def _routing_combines(self) -> LlmEndpointSettings:
        if self.routing_strategy == "prefix_aware" and self.capacity.sessions:
            raise ValueError("routing_strategy: 'prefix_aware' with capacity.sessions: true; "
                             "accepted: prefix_aware with capacity.sessions false (AWS documents"
                             " no routing of a stateful session's requests under PREFIX_AWARE)"
                             ", or least_outstanding")
        return self

    @model_validator(mode="after")
    def _deployment_honoured(self) -> LlmEndpointSettings:
        problem = deployment_problem(self.deployment, instance_type=self.instance_type,
                                     min_capacity=self.scaling.min_capacity)
        if problem:
            raise ValueError(problem)
        return self

    def decode_speed_table(self) -> DecodeSpeedTable:
        """The decode-speed table the capacity model reads."""
        path = self.capacity.decode_speed_file
        return parse_decode_table((REPO_ROOT / path).read_text(encoding="utf-8"), source=path)

    def capacity_plan(self, memory_plan: MemoryPlan | None = None, *,
                      what_if: dict[str, float] | None = None) -> LlmCapacity:
        """The capacity model's plan for these settings: per-instance capacity and caps, the
        fleet's targets and daily limits, the long-conversation options. ``memory_plan``: the
        GPU budget's plan of these settings when already made (default: :meth:`memory_plan`).

        The stacks never call it: they get the plan computed once when the settings load
        (:class:`stacks.settings.plans.EnvironmentPlans`); tools and tests do. ``what_if``
        sets :class:`capacity_model.ReuseInputs` fields (``lora_step_factor``,
        ``decode_compute_efficiency``) for the plan's range report."""
        if memory_plan is None:
            memory_plan = self.memory_plan()
        window = ContextWindow(**self.context_window.model_dump())
        mix = request_mix(
            [BucketDemand(RequestBucket(name), d.share, d.prompt_tokens, d.max_tokens,
                          d.output_tokens, d.system_tokens, d.history_tokens)
             for name, d in self.capacity.request_mix.items()],
            bucket_bounds(self.max_model_len),
        )
        conversation = self.capacity.conversation
        return llm_capacity(
            plan=memory_plan,
            replan=self.memory_plan,
            mix=mix,
            window=window,
            table=self.decode_speed_table(),
            slo=LatencySlo(self.alarms.time_to_first_token_p99_ms,
                           self.alarms.time_per_output_token_p99_ms,
                           self.alarms.first_response_p999_ms),
            admission_watermark=self.capacity.admission_watermark,
            policy=self.scaling.fleet_policy(),
            profile=self.scaling.traffic.profile(),
            conversation=Conversation(conversation.turns, conversation.tokens_per_turn,
                                      conversation.system_tokens, conversation.rag_tokens,
                                      conversation.rag_chunks),
            conversations_wanted=conversation.concurrent_wanted,
            reuse=ReuseInputs(sessions=self.capacity.sessions,
                              think_time_s=conversation.think_time_s,
                              scenario=self.capacity.rates.scenario,
                              prefill_factor=self.capacity.rates.prefill_factor,
                              lora_step_factor=(what_if or {}).get("lora_step_factor"),
                              decode_compute_efficiency=(what_if or {}).get(
                                  "decode_compute_efficiency")),
        )

    def memory_plan(self, *, kv_cache_dtype: str | None = None,
                    instance: str | None = None) -> MemoryPlan:
        """The GPU budget's plan for these settings (raises BudgetError when it cannot fit);
        ``kv_cache_dtype`` / ``instance`` plan the same settings with another KV-cache dtype or
        instance type (the capacity model's what-ifs)."""
        return plan(
            str(REPO_ROOT / self.model.config),
            quantization=self.model.quantization,
            instance=instance or self.instance_type,
            max_model_len=self.max_model_len,
            kv_cache_dtype=kv_cache_dtype or self.kv_cache_dtype,
            block_size=self.block_size,
            gpu_memory_utilization=self.engine.gpu_memory_utilization,
            max_num_seqs=self.engine.max_num_seqs,
            max_num_batched_tokens=self.engine.max_num_batched_tokens,
            max_loras=self.lora_slots,
            max_lora_rank=self.max_lora_rank,
        )

    @property
    def lora_slots(self) -> int:
        """Adapters vLLM keeps on the GPU at once (max_loras)."""
        return self.max_loras if self.max_loras is not None else len(self.adapters)

    @property
    def max_lora_rank(self) -> int:
        """The largest adapter rank (vLLM sizes every slot for it)."""
        return max((adapter.rank for adapter in self.adapters), default=0)
