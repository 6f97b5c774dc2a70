"""Weight bytes by precision and checkpoint format, per GPU under tensor parallelism.

Formats and what they store (the sizes follow the tensors the checkpoints hold and vLLM loads):

* ``bf16`` / ``fp16`` — every parameter in 2 bytes.
* ``int8`` — llm-compressor INT8 (compressed-tensors, channel-wise): the decoder projections in
  1 byte plus one scale per output channel (counted as 4 bytes, fp32, to stay on the safe side).
* ``awq`` — AutoAWQ GEMM checkpoint (``quant_method: awq``): per projection ``qweight`` int32
  ``[in, out/8]`` (eight 4-bit values per int32, i.e. ½ byte per weight), ``scales`` fp16
  ``[in/group, out]`` and ``qzeros`` int32 ``[in/group, out/8]`` (4-bit zero points, packed the
  same way). Groups run along the input dimension, 64 or 128 wide.
* ``w4a16`` — llm-compressor ``W4A16_ASYM`` (``quant_method: compressed-tensors``,
  pack-quantized): ``weight_packed`` int32 ``[out, in/8]``, ``weight_scale`` 16-bit
  ``[out, in/group]`` and, for the asymmetric scheme, ``weight_zero_point`` packed to 4 bits
  ``[out/8, in/group]`` — byte for byte the same budget as AWQ.

What stays 16 bit in every quantized format: ``embed_tokens`` (an embedding, not a Linear
layer, so neither AutoAWQ nor llm-compressor's ``targets=["Linear"]`` touches it), ``lm_head``
(AutoAWQ never quantizes it and vLLM's AWQ loader expects it unquantized; llm-compressor recipes
pass ``ignore=["lm_head"]``), all RMSNorm weights and projection biases.

Tensor parallelism (vLLM's Megatron-style split): column-parallel projections (q/k/v, gate/up)
split their output features, row-parallel ones (o_proj, down_proj) their input features; k/v are
replicated when the tensor-parallel size exceeds the KV heads; the vocabulary of embed_tokens and
lm_head is padded to a multiple of 64 (vLLM's ``DEFAULT_VOCAB_PADDING_SIZE``) and split; norms
are replicated on every GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_budget.model_spec import LinearShape, ModelSpec

VOCAB_PADDING = 64
"""vLLM pads the vocabulary of VocabParallelEmbedding / ParallelLMHead to a multiple of this."""

SUPPORTED_GROUP_SIZES: tuple[int, ...] = (64, 128)


@dataclass(frozen=True)
class WeightFormat:
    """How a checkpoint stores the decoder projections.

    ``bits`` is 16, 8 or 4. ``group_size`` applies to 4-bit formats. ``checkpoint_quant_method`` is
    the ``quant_method`` of the checkpoint's ``quantization_config`` (None for 16-bit weights).
    """

    name: str
    bits: int
    group_size: int | None = None
    zero_point: bool = False
    checkpoint_quant_method: str | None = None
    dtype: str = "bfloat16"

    def label(self) -> str:
        """Short human label, e.g. ``awq int4 g128``."""
        if self.bits == 16:
            return self.name
        if self.bits == 8:
            return f"{self.name} int8"
        return f"{self.name} int4 g{self.group_size}"


BF16 = WeightFormat("bf16", 16, dtype="bfloat16")
FP16 = WeightFormat("fp16", 16, dtype="float16")
INT8 = WeightFormat("int8", 8, checkpoint_quant_method="compressed-tensors")


def awq(group_size: int = 128) -> WeightFormat:
    """An AutoAWQ GEMM checkpoint (4-bit, zero points, fp16 scales)."""
    return WeightFormat("awq", 4, group_size, True, "awq", "float16")


def w4a16(group_size: int = 128, *, zero_point: bool = True) -> WeightFormat:
    """An llm-compressor W4A16 checkpoint (``W4A16_ASYM`` when ``zero_point``)."""
    return WeightFormat("w4a16", 4, group_size, zero_point, "compressed-tensors", "bfloat16")


QUANTIZATION_CHOICES: tuple[str, ...] = (
    "bf16",
    "fp16",
    "int8",
    "awq",
    "awq-g64",
    "awq-g128",
    "w4a16",
    "w4a16-g64",
    "w4a16-g128",
    "compressed-tensors",
)
"""Names :func:`parse_quantization` accepts (``none`` is an alias of ``bf16``)."""


def parse_quantization(value: str | WeightFormat | None) -> WeightFormat:
    """Turn a CLI/settings name into a :class:`WeightFormat`.

    ``None``/``"none"``/``"bf16"`` → bf16; ``"awq"`` → AutoAWQ group 128; ``"awq-g64"`` → group 64;
    ``"w4a16"``/``"compressed-tensors"`` → llm-compressor W4A16 group 128. Raises ``ValueError``
    naming the accepted values.
    """
    if isinstance(value, WeightFormat):
        return value
    key = (value or "bf16").strip().lower()
    table = {
        "none": BF16,
        "bf16": BF16,
        "bfloat16": BF16,
        "fp16": FP16,
        "float16": FP16,
        "int8": INT8,
        "awq": awq(128),
        "awq-g128": awq(128),
        "awq-g64": awq(64),
        "w4a16": w4a16(128),
        "w4a16-g128": w4a16(128),
        "w4a16-g64": w4a16(64),
        "compressed-tensors": w4a16(128),
    }
    if key not in table:
        raise ValueError(
            f"quantization {value!r} is not known; accepted: {', '.join(QUANTIZATION_CHOICES)}"
        )
    return table[key]


def _sharded_linear(lin: LinearShape, tp: int) -> tuple[int, int]:
    """(in, out) features of one GPU's shard of ``lin`` under tensor parallelism ``tp``."""
    if lin.parallel == "row":
        return lin.in_features // tp, lin.out_features
    if lin.kv_heads is not None:
        heads_per_gpu = max(1, lin.kv_heads // tp)
        return lin.in_features, lin.out_features // lin.kv_heads * heads_per_gpu
    return lin.in_features, lin.out_features // tp


def _linear_bytes(in_features: int, out_features: int, fmt: WeightFormat) -> int:
    """Bytes of one projection's weight tensors in ``fmt`` (biases excluded)."""
    params = in_features * out_features
    if fmt.bits == 16:
        return params * 2
    if fmt.bits == 8:
        return params + out_features * 4
    group = fmt.group_size or 128
    groups = in_features // group
    packed = params // 2
    scales = groups * out_features * 2
    zeros = groups * out_features // 2 if fmt.zero_point else 0
    return packed + scales + zeros


def padded_vocab(vocab_size: int, tp: int = 1) -> int:
    """Vocabulary rows one GPU holds: padded to ``VOCAB_PADDING`` × tp, then split."""
    multiple = VOCAB_PADDING * tp
    return -(-vocab_size // multiple) * multiple // tp


def check_tensor_parallel(model: ModelSpec, tp: int, fmt: WeightFormat | None = None) -> str | None:
    """Why ``model`` cannot be split ``tp`` ways (None when it can).

    vLLM asserts that the attention heads and the MLP width divide evenly, that KV heads either
    divide by tp or tp by them, and (for grouped 4-bit formats) that each row-parallel shard's
    input width is a whole number of groups.
    """
    if tp < 1:
        return f"tensor_parallel_size must be at least 1, got {tp}"
    if model.num_attention_heads % tp:
        return (
            f"{model.num_attention_heads} attention heads cannot be split across {tp} GPUs "
            "(tensor_parallel_size must divide the attention heads)"
        )
    kv = model.num_key_value_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        return f"{kv} KV heads cannot be split or replicated evenly across {tp} GPUs"
    if model.intermediate_size % tp:
        return f"intermediate_size {model.intermediate_size} is not divisible by {tp}"
    if fmt is not None and fmt.bits == 4 and fmt.group_size:
        for lin in model.layer_linears():
            in_features, _ = _sharded_linear(lin, tp)
            if in_features % fmt.group_size:
                return (
                    f"{lin.name} input width per GPU ({in_features}) is not a multiple of the "
                    f"{fmt.group_size}-wide quantization groups at tensor_parallel_size {tp}"
                )
    return None


def weights_bytes(model: ModelSpec, quantization: str | WeightFormat | None = None, *,
                  tensor_parallel_size: int = 1) -> int:
    """Bytes of model weights held by one GPU (the whole model when ``tensor_parallel_size`` is 1).

    Raises ``ValueError`` when the model cannot be split that many ways or the 4-bit group size
    does not divide a projection's input width.
    """
    fmt = parse_quantization(quantization)
    tp = tensor_parallel_size
    problem = check_tensor_parallel(model, tp, fmt)
    if problem:
        raise ValueError(problem)
    if fmt.bits == 4 and fmt.group_size not in SUPPORTED_GROUP_SIZES:
        raise ValueError(
            f"group size {fmt.group_size} is not supported; use one of {SUPPORTED_GROUP_SIZES}"
        )
    per_layer = 0
    for lin in model.layer_linears():
        in_features, out_features = _sharded_linear(lin, tp)
        per_layer += _linear_bytes(in_features, out_features, fmt)
        if lin.has_bias:
            # Row-parallel biases are added once after the all-reduce (held whole on each GPU).
            per_layer += (out_features if lin.parallel == "column" else lin.out_features) * 2
    per_layer += model.layer_norm_parameters * 2
    vocab_rows = padded_vocab(model.vocab_size, tp)
    embedding_copies = 1 if model.tie_word_embeddings else 2
    embeddings = embedding_copies * vocab_rows * model.hidden_size * 2
    final_norm = model.hidden_size * 2
    return per_layer * model.num_hidden_layers + embeddings + final_norm
