"""What the gateway does when an engine becomes ready, when one dies, and when the breaker moves.

The supervisor (:mod:`gateway.supervisor`) owns the engine slot and calls these when the state
changes; the circuit breaker, built before them, reports its transitions to the callback
:func:`breaker_transition_publisher` makes. Each event is logged once and, where it is one,
emitted as its metric (names from ``metrics_contract``):

* **ready** — admission is sized from the engine's real KV pool (never the plan's), the pool is
  compared with the GPU budget's prediction, the prompt rendering is checked against the engine
  tokenizer (:mod:`gateway.rendering`), and a pool that cannot hold one ``max_model_len``
  request is fatal. A rebuilt engine (generation > 0) emits ``EngineRestarts``.
* **death** — the breaker trips and ``OOMCircuitTrips`` is emitted, once per engine death however
  many requests it failed.
* **breaker transition** — ``BreakerState``; admission re-checks its waiters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import metrics_contract as mc
from gateway.admission import AdmissionController
from gateway.breaker import BreakerState, CircuitBreaker
from gateway.engines.base import (
    EngineDead,
    EngineOutOfMemory,
    InferenceEngine,
    SupportsChatRendering,
)
from gateway.health import CrashLoopDetector
from gateway.rendering import PromptRendering, apply_rendering, check_rendering
from gateway.settings import Settings
from gateway.telemetry import Telemetry
from gateway.tokenizer import ChatTokenizer
from gpu_budget import compare_engine_report
from gpu_budget.lengths import blocks_for_tokens

FatalCallback = Callable[[str], None]


class EngineEvents:
    """The gateway's reactions to engine and breaker events (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        *,
        admission: AdmissionController,
        breaker: CircuitBreaker,
        tokenizer: ChatTokenizer,
        crash_loop: CrashLoopDetector,
        telemetry: Telemetry,
        clock: Callable[[], float],
        on_fatal: FatalCallback,
    ) -> None:
        self.settings = settings
        self.admission = admission
        self.breaker = breaker
        self.tokenizer = tokenizer
        self.crash_loop = crash_loop
        self.telemetry = telemetry
        self.clock = clock
        self.on_fatal = on_fatal
        initial = (PromptRendering.ASSEMBLED if tokenizer.segmented
                   else PromptRendering.WHOLE_TEXT)
        self.rendering: dict[str, Any] = {
            "mode": initial.value, "verified": False,
            "detail": "not yet checked against the engine tokenizer"}
        """/ping's ``prompt_rendering``: how prompts are rendered, and whether that was checked."""

    # --- engine ready ---
    def on_ready(self, generation: int, engine: InferenceEngine) -> None:
        """Size admission from the engine's pool, check it, and say it is back."""
        capacity = engine.kv_capacity()
        max_model_len = self.settings.engine.max_model_len
        ledger = self.admission.ledger
        ledger.set_capacity(capacity)
        needed = blocks_for_tokens(max_model_len, capacity.block_size)
        self.telemetry.log(
            "engine_ready", engine=engine.name, engine_generation=generation,
            kv_blocks=capacity.num_blocks, block_size=capacity.block_size,
            kv_tokens=capacity.num_tokens, admission_limit_blocks=ledger.limit_blocks,
            max_concurrency_at_max_model_len=round(capacity.num_tokens / max_model_len, 2),
        )
        expected = self.settings.gateway.expected_kv_tokens
        if expected is not None:
            # The GPU budget's prediction vs what the engine really got (vLLM's profile run):
            # admission always uses the engine's figure; a gap beyond the budget's tolerance
            # means the plan's constants need another look on this GPU.
            report = compare_engine_report(expected, capacity.num_blocks, capacity.block_size)
            self.telemetry.log(
                "kv_capacity_vs_plan", level="info" if report.within_tolerance else "warning",
                planned_kv_tokens=report.planned_kv_tokens,
                engine_kv_tokens=report.engine_kv_tokens,
                relative_difference=round(report.relative_difference, 4),
                message=report.message,
            )
        self.check_chat_rendering(engine)
        if needed > ledger.limit_blocks:
            self.on_fatal(
                f"KV capacity check failed: the engine has {capacity.num_blocks} blocks of "
                f"{capacity.block_size} tokens; with GATEWAY_ADMISSION_WATERMARK="
                f"{ledger.watermark:g} admission may use {ledger.limit_blocks}, fewer than the "
                f"{needed} one ENGINE_MAX_MODEL_LEN={max_model_len} request needs; lower "
                "ENGINE_MAX_MODEL_LEN or give the engine more KV memory"
            )
        if generation > 0:
            # A new engine: what the valve learned of the dead one does not decide for it (its
            # warmup measures it again before it serves).
            self.admission.reset_learning()
            self.telemetry.emit({mc.ENGINE_RESTARTS: 1}, event="engine_restarted",
                                engine_generation=generation, restarts=generation)
        self.admission.notify()

    def check_chat_rendering(self, engine: InferenceEngine) -> None:
        """The gateway renders prompts itself (it must count them): check once per engine that
        the engine tokenizer's own chat template gives the same token ids, and switch to a
        rendering that does when it does not (:mod:`gateway.rendering`)."""
        if not isinstance(engine, SupportsChatRendering):
            return
        try:
            reference = engine.chat_renderer()
            check = check_rendering(self.tokenizer, reference)
        except Exception as error:  # the check could not run: serve, but say it is unverified
            self.rendering = {"mode": self.rendering["mode"], "verified": False,
                              "detail": f"check failed: {type(error).__name__}: {error}"[:300]}
            self.telemetry.log("chat_template_check_failed", level="warning",
                               error=f"{type(error).__name__}: {error}"[:500])
            return
        apply_rendering(self.tokenizer, check, reference)
        self.rendering = {"mode": check.mode.value, "verified": True, "detail": check.detail}
        if check.matches:
            self.telemetry.log("chat_template_check", matches=True, mode=check.mode.value,
                               detail=check.detail)
            return
        self.telemetry.log(
            "chat_template_check", level="warning", matches=False, mode=check.mode.value,
            probe=check.probe, first_difference_at=check.position,
            gateway_tokens=check.gateway_tokens, engine_tokens=check.engine_tokens,
            message=f"the gateway's chat rendering differs from the engine tokenizer's: "
                    f"{check.detail}",
        )

    # --- engine death ---
    def on_death(self, generation: int, error: EngineDead) -> None:
        """Trip the breaker and count the trip (once per engine death); the requests queued for
        dispatch are answered at once (503: no engine takes them before the rebuild ends)."""
        cause = "out_of_memory" if isinstance(error, EngineOutOfMemory) else "engine_dead"
        self.breaker.record_trip(self.clock(), why=f"{cause}: {error}")
        refused = self.admission.refuse_waiting()
        self.telemetry.emit({mc.OOM_CIRCUIT_TRIPS: 1}, event="engine_death", level="error",
                            cause=cause, engine_generation=generation, error=str(error)[:500],
                            queued_refused=refused,
                            deaths_in_window=self.crash_loop.deaths_in_window(self.clock()))
        self.admission.notify()


def breaker_transition_publisher(telemetry: Telemetry, admission: AdmissionController
                                 ) -> Callable[[BreakerState, BreakerState, str], None]:
    """The breaker's ``on_transition``: publish its new state; admission re-checks its waiters
    (the probe limit may change)."""

    def on_transition(old: BreakerState, new: BreakerState, why: str) -> None:
        telemetry.emit({mc.BREAKER_STATE: new.metric_value}, event="breaker_transition",
                       from_state=old.value, to_state=new.value, why=why[:300])
        admission.notify()

    return on_transition
