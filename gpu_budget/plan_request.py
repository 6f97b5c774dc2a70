"""The planner's inputs: normalized into a :class:`PlanRequest`, then checked against a table of
setting checks (:data:`SETTING_CHECKS`) before anything is sized.

Each check names the setting it guards, says when a request is refused and how the refusal reads;
they run in order and the first that applies raises :class:`BudgetError` (``invalid-setting``).
Block sizes, LoRA ranks and the utilization cap come from the engine-argument table
(:mod:`gpu_budget.engine_args`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_budget.engine_args import BLOCK_SIZES, DEFAULT_BLOCK_SIZE, MAX_LORA_RANKS
from gpu_budget.instances import (
    MAX_GPU_MEMORY_UTILIZATION,
    InstanceType,
    gpu_memory_utilization_for,
    instance_type,
)
from gpu_budget.kv import KV_CACHE_DTYPES
from gpu_budget.lengths import RequestLengthDistribution, as_distribution
from gpu_budget.memory_plan import BudgetError
from gpu_budget.model_spec import ModelSpec, load_model_spec
from gpu_budget.weights import (
    INT8,
    WeightFormat,
    awq,
    check_tensor_parallel,
    parse_quantization,
    w4a16,
)


@dataclass(frozen=True)
class PlanRequest:
    """Normalized inputs of one evaluation."""

    model: ModelSpec
    fmt: WeightFormat
    instance: InstanceType
    max_model_len: int
    kv_cache_dtype: str
    tensor_parallel_size: int
    block_size: int
    gpu_memory_utilization: float | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int | None
    lengths: RequestLengthDistribution | None



def weight_format(spec: ModelSpec, quantization: str | WeightFormat | None) -> WeightFormat:
    """The format to size: as given, or read from the checkpoint's quantization_config.

    ``quantization=None`` takes the checkpoint's own format (16-bit when it has none). A format
    that contradicts the checkpoint's ``quant_method`` is refused: sizing AWQ weights as bf16, or
    the reverse, would be wrong by a factor of three.
    """
    method = spec.checkpoint_quant_method
    from_checkpoint: WeightFormat | None = None
    if method == "awq":
        from_checkpoint = awq(spec.checkpoint_quant_group_size or 128)
    elif method == "compressed-tensors" and spec.checkpoint_quant_bits == 4:
        from_checkpoint = w4a16(spec.checkpoint_quant_group_size or 128)
    elif method == "compressed-tensors" and spec.checkpoint_quant_bits == 8:
        from_checkpoint = INT8
    if quantization is None:
        return from_checkpoint or parse_quantization(None)
    fmt = parse_quantization(quantization)
    if method and fmt.checkpoint_quant_method != method:
        raise ValueError(
            f"quantization {fmt.name!r} contradicts {spec.name}'s config.json, whose "
            f"quantization_config says quant_method {method!r}; pass quantization="
            f"{(from_checkpoint.name if from_checkpoint else method)!r} or leave it unset"
        )
    return fmt


INTEGER_SETTINGS: tuple[str, ...] = ("max_model_len", "tensor_parallel_size", "block_size",
                                     "max_loras", "max_lora_rank")
"""The settings that must be integers (a bool is not one)."""


def normalize(
    model: ModelSpec | str,
    *,
    quantization: str | WeightFormat | None,
    instance: InstanceType | str,
    request_lengths: RequestLengthDistribution | Sequence[int] | None,
    **settings: Any,
) -> PlanRequest:
    """:func:`gpu_budget.planner.plan`'s arguments as a :class:`PlanRequest`: the model, format,
    instance and request lengths read, every other setting (``plan``'s keyword arguments, which
    type them) taken as it is, each :data:`INTEGER_SETTINGS` one checked to be an integer."""

    def refuse(message: str) -> BudgetError:
        return BudgetError(message, kind="invalid-setting")

    try:
        spec = model if isinstance(model, ModelSpec) else load_model_spec(model)
        fmt = weight_format(spec, quantization)
        inst = instance if isinstance(instance, InstanceType) else instance_type(instance)
        lengths = as_distribution(request_lengths)
    except ValueError as exc:
        raise refuse(str(exc)) from None
    for name in INTEGER_SETTINGS:
        value = settings[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise refuse(f"{name} must be an integer, got {value!r}.")
    return PlanRequest(model=spec, fmt=fmt, instance=inst, lengths=lengths, **settings)


# ======================================================================== the setting checks
@dataclass(frozen=True)
class SettingCheck:
    """One check: the setting it guards, when a request is refused, and the refusal's text."""

    field: str
    refused: Callable[[PlanRequest], bool]
    message: Callable[[PlanRequest], str]


def _compute_capability(req: PlanRequest) -> tuple[int, int]:
    """The GPU's compute capability (the first check refuses an instance without one)."""
    return req.instance.compute_capability or (0, 0)


def _not_a_gpu(req: PlanRequest) -> str:
    inst = req.instance
    return (
        f"{inst.name} is an Inferentia instance ({inst.accelerator_count} × "
        f"{inst.accelerator_model}, {inst.neuron_cores} NeuronCores): it has no CUDA GPU, so "
        "vLLM's GPU memory budget does not apply. Choose a GPU instance (ml.g5, ml.g6, "
        "ml.g6e, ml.g4dn, ml.p4d, ml.p4de, ml.p5) for the LLM, or compile for Neuron instead."
    )


def _beyond_positions(req: PlanRequest) -> str:
    return (
        f"max_model_len {req.max_model_len:,} exceeds {req.model.name}'s "
        f"max_position_embeddings ({req.model.max_position_embeddings:,}); vLLM refuses a "
        "context the model was not trained for. Lower max_model_len to at most "
        f"{req.model.max_position_embeddings:,}."
    )


def _utilization_outside(req: PlanRequest) -> bool:
    util = req.gpu_memory_utilization
    return util is not None and not 0 < util <= MAX_GPU_MEMORY_UTILIZATION


def _unsafe_utilization(req: PlanRequest) -> str:
    inst = req.instance
    return (
        f"gpu_memory_utilization {req.gpu_memory_utilization} is outside the safe range (0, "
        f"{MAX_GPU_MEMORY_UTILIZATION}]: above {MAX_GPU_MEMORY_UTILIZATION} nothing is left "
        "for the CUDA context, allocator fragmentation and the CUDA graphs vLLM captures after "
        "sizing its cache. Leave it unset to use the SKU rule "
        f"({gpu_memory_utilization_for(inst.memory_per_accelerator_bytes):.2f} on "
        f"{inst.accelerator_model})."
    )


def _no_bfloat16(req: PlanRequest) -> str:
    major, minor = _compute_capability(req)
    return (
        f"{req.instance.accelerator_model} (compute capability {major}.{minor}) has no "
        "bfloat16; serve fp16 weights (quantization 'fp16') or an AWQ checkpoint instead."
    )


def _batched_below_seqs(req: PlanRequest) -> bool:
    batched = req.max_num_batched_tokens
    return batched is not None and batched < (req.max_num_seqs or 1)


SETTING_CHECKS: tuple[SettingCheck, ...] = (
    SettingCheck(
        "instance",
        lambda req: req.instance.accelerator_kind != "gpu"
        or req.instance.compute_capability is None,
        _not_a_gpu,
    ),
    SettingCheck(
        "max_model_len",
        lambda req: req.max_model_len < 1,
        lambda req: f"max_model_len must be a positive token count, got {req.max_model_len}.",
    ),
    SettingCheck(
        "max_model_len",
        lambda req: req.max_model_len > req.model.max_position_embeddings,
        _beyond_positions,
    ),
    SettingCheck(
        "block_size",
        lambda req: req.block_size not in BLOCK_SIZES,
        lambda req: f"block_size {req.block_size} is not one vLLM's CUDA attention backends "
        f"accept; use one of {', '.join(map(str, BLOCK_SIZES))} ({DEFAULT_BLOCK_SIZE} is the "
        "default).",
    ),
    SettingCheck(
        "kv_cache_dtype",
        lambda req: req.kv_cache_dtype not in KV_CACHE_DTYPES,
        lambda req: f"kv_cache_dtype {req.kv_cache_dtype!r} is not supported; use one of "
        f"{', '.join(KV_CACHE_DTYPES)}.",
    ),
    SettingCheck("gpu_memory_utilization", _utilization_outside, _unsafe_utilization),
    SettingCheck(
        "tensor_parallel_size",
        lambda req: req.tensor_parallel_size < 1,
        lambda req: f"tensor_parallel_size must be at least 1, got {req.tensor_parallel_size}.",
    ),
    SettingCheck(
        "tensor_parallel_size",
        lambda req: req.tensor_parallel_size > req.instance.gpu_count,
        lambda req: f"tensor_parallel_size {req.tensor_parallel_size} needs "
        f"{req.tensor_parallel_size} GPUs but {req.instance.name} has {req.instance.gpu_count}; "
        "choose a larger instance or a smaller tensor_parallel_size.",
    ),
    SettingCheck(
        "tensor_parallel_size",
        lambda req: bool(check_tensor_parallel(req.model, req.tensor_parallel_size, req.fmt)),
        lambda req: f"{check_tensor_parallel(req.model, req.tensor_parallel_size, req.fmt)}.",
    ),
    SettingCheck(
        "quantization",
        lambda req: req.fmt.bits == 16 and req.fmt.dtype == "bfloat16"
        and _compute_capability(req) < (8, 0),
        _no_bfloat16,
    ),
    SettingCheck(
        "max_loras",
        lambda req: req.max_loras < 0,
        lambda req: f"max_loras must be 0 (LoRA off) or more, got {req.max_loras}.",
    ),
    SettingCheck(
        "max_lora_rank",
        lambda req: req.max_loras > 0 and req.max_lora_rank not in MAX_LORA_RANKS,
        lambda req: f"max_lora_rank {req.max_lora_rank} is not one vLLM accepts; use one of "
        f"{', '.join(map(str, MAX_LORA_RANKS))}.",
    ),
    SettingCheck(
        "max_lora_rank",
        lambda req: req.max_loras == 0 and bool(req.max_lora_rank),
        lambda req: f"max_lora_rank {req.max_lora_rank} is set but max_loras is 0; set "
        "max_loras (the adapter slots on the GPU) or drop the rank.",
    ),
    SettingCheck(
        "max_cpu_loras",
        lambda req: req.max_cpu_loras is not None and req.max_cpu_loras < req.max_loras,
        lambda req: f"max_cpu_loras ({req.max_cpu_loras}) must be at least max_loras "
        f"({req.max_loras}).",
    ),
    SettingCheck(
        "max_num_seqs",
        lambda req: req.max_num_seqs is not None and req.max_num_seqs < 1,
        lambda req: f"max_num_seqs must be at least 1, got {req.max_num_seqs}.",
    ),
    SettingCheck(
        "max_num_batched_tokens",
        lambda req: req.max_num_batched_tokens is not None and req.max_num_batched_tokens < 1,
        lambda req: f"max_num_batched_tokens must be at least 1, got "
        f"{req.max_num_batched_tokens}.",
    ),
    SettingCheck(
        "max_num_batched_tokens",
        _batched_below_seqs,
        lambda req: f"max_num_batched_tokens ({req.max_num_batched_tokens:,}) must be at least "
        f"max_num_seqs ({req.max_num_seqs or 1:,}); vLLM refuses to start otherwise.",
    ),
)
"""Every setting check, in the order they run (the first that applies is the refusal)."""


def validate_settings(req: PlanRequest) -> None:
    """Raise BudgetError(kind='invalid-setting') for the first setting outside its accepted
    values (:data:`SETTING_CHECKS`, in order)."""
    for check in SETTING_CHECKS:
        if check.refused(req):
            raise BudgetError(check.message(req), kind="invalid-setting")
