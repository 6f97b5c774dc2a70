"""Model architecture facts read from a Hugging Face ``config.json``.

Only the numbers that size GPU memory are kept: layer and head counts, widths, vocabulary, whether
the input and output embeddings are one tensor, the context limit and the biases/norms that add
(small) 16-bit tensors. The parameter count is computed from those numbers with the same layer
shapes the Hugging Face and vLLM implementations build (``LlamaForCausalLM``,
``MistralForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``); the tests check it against
``transformers`` instantiating the architecture on the meta device.

Pure module: it reads a file only in :func:`load_model_spec`; no torch, AWS or CDK imports.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
"""Dense decoder-only architectures whose layer shapes this module knows exactly."""

# Architectures whose q/k/v projections always carry a bias (Qwen2 hard-codes bias=True).
_QKV_BIAS_ARCHITECTURES = frozenset({"Qwen2ForCausalLM"})
# Architectures with per-head RMSNorm on q and k (Qwen3's q_norm / k_norm, head_dim wide).
_QK_NORM_ARCHITECTURES = frozenset({"Qwen3ForCausalLM"})
# Keys that mark a mixture-of-experts config: the dense shapes below would be wrong for it.
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")

_REQUIRED_KEYS = (
    "num_hidden_layers",
    "num_attention_heads",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
)


class ModelSpecError(ValueError):
    """A config.json that cannot describe a supported dense decoder model."""


@dataclass(frozen=True)
class LinearShape:
    """One projection matrix of a decoder layer, as (input features, output features).

    ``parallel`` says how tensor parallelism splits it: ``"column"`` splits the output features
    (q/k/v, gate/up), ``"row"`` splits the input features (o_proj, down_proj). ``kv_heads`` is set
    for k_proj/v_proj, which vLLM replicates when the tensor-parallel size exceeds the KV heads.
    """

    name: str
    in_features: int
    out_features: int
    parallel: str
    has_bias: bool = False
    kv_heads: int | None = None


@dataclass(frozen=True)
class ModelSpec:
    """The architecture numbers that size a model's GPU memory.

    Build it with :meth:`from_hf_config` (a path to ``config.json`` or its parsed mapping) or
    :func:`load_model_spec`. ``parameter_count`` is exact for the supported architectures.
    """

    name: str
    architecture: str
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    torch_dtype: str = "bfloat16"
    attention_bias: bool = False
    qkv_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    checkpoint_quant_method: str | None = None
    checkpoint_quant_bits: int | None = None
    checkpoint_quant_group_size: int | None = None

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_hf_config(
        cls, path_or_mapping: str | Path | Mapping[str, Any], *, name: str | None = None
    ) -> ModelSpec:
        """Read a Hugging Face ``config.json`` (path or already-parsed mapping).

        ``head_dim`` is taken from the config when present (Llama-3.2 states it) and otherwise is
        ``hidden_size // num_attention_heads``; ``num_key_value_heads`` defaults to the attention
        heads (plain multi-head attention). A ``quantization_config`` block (AutoAWQ or
        llm-compressor output) is recorded so a plan can pick the matching vLLM kernel.

        Raises :class:`ModelSpecError` naming the missing or invalid field.
        """
        if isinstance(path_or_mapping, (str, Path)):
            path = Path(path_or_mapping)
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                raise ModelSpecError(f"model config {str(path)!r} does not exist") from None
            except json.JSONDecodeError as exc:
                raise ModelSpecError(
                    f"model config {str(path)!r} is not valid JSON: {exc.msg} at line {exc.lineno}"
                ) from None
            if not isinstance(raw, dict):
                raise ModelSpecError(f"model config {str(path)!r} must hold a JSON object")
            default_name = path.stem
        else:
            raw = dict(path_or_mapping)
            default_name = str(raw.get("_name_or_path") or "model")
        return cls._from_mapping(raw, name=name or default_name)

    @classmethod
    def _from_mapping(cls, raw: Mapping[str, Any], *, name: str) -> ModelSpec:
        architecture = _check_supported_shape(raw)
        layers = _positive_int("num_hidden_layers", raw["num_hidden_layers"])
        heads = _positive_int("num_attention_heads", raw["num_attention_heads"])
        hidden = _positive_int("hidden_size", raw["hidden_size"])
        intermediate = _positive_int("intermediate_size", raw["intermediate_size"])
        vocab = _positive_int("vocab_size", raw["vocab_size"])
        kv_heads = _positive_int(
            "num_key_value_heads", raw.get("num_key_value_heads") or heads
        )
        if heads % kv_heads:
            raise ModelSpecError(
                f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads "
                f"({kv_heads})"
            )
        head_dim = _head_dim(raw.get("head_dim"), hidden=hidden, heads=heads)
        max_positions = _positive_int(
            "max_position_embeddings", raw.get("max_position_embeddings", 2048)
        )
        quant = raw.get("quantization_config") or {}
        quant_method = quant.get("quant_method") if isinstance(quant, Mapping) else None
        quant_bits, quant_group = _quant_bits_and_group(quant) if quant_method else (None, None)
        return cls(
            name=name,
            architecture=architecture,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            hidden_size=hidden,
            intermediate_size=intermediate,
            vocab_size=vocab,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            max_position_embeddings=max_positions,
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "bfloat16"),
            attention_bias=bool(raw.get("attention_bias", False)),
            qkv_bias=architecture in _QKV_BIAS_ARCHITECTURES,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=architecture in _QK_NORM_ARCHITECTURES,
            checkpoint_quant_method=str(quant_method) if quant_method else None,
            checkpoint_quant_bits=quant_bits,
            checkpoint_quant_group_size=quant_group,
        )

    # ----------------------------------------------------------------- shapes
    @property
    def q_size(self) -> int:
        """Output features of q_proj (attention heads × head_dim)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Output features of k_proj (and of v_proj): KV heads × head_dim."""
        return self.num_key_value_heads * self.head_dim

    def layer_linears(self) -> tuple[LinearShape, ...]:
        """The seven projection matrices of one decoder layer, in checkpoint order."""
        hidden, inter = self.hidden_size, self.intermediate_size
        qkv_bias = self.qkv_bias or self.attention_bias
        kv_heads = self.num_key_value_heads
        return (
            LinearShape("q_proj", hidden, self.q_size, "column", qkv_bias),
            LinearShape("k_proj", hidden, self.kv_size, "column", qkv_bias, kv_heads),
            LinearShape("v_proj", hidden, self.kv_size, "column", qkv_bias, kv_heads),
            LinearShape("o_proj", self.q_size, hidden, "row", self.attention_bias),
            LinearShape("gate_proj", hidden, inter, "column", self.mlp_bias),
            LinearShape("up_proj", hidden, inter, "column", self.mlp_bias),
            LinearShape("down_proj", inter, hidden, "row", self.mlp_bias),
        )

    @property
    def layer_norm_parameters(self) -> int:
        """RMSNorm weights in one decoder layer (two hidden-wide, plus q/k norms on Qwen3)."""
        return 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def linear_parameters(self) -> int:
        """Weights (not biases) of all decoder-layer projections: what a quantizer packs."""
        per_layer = sum(lin.in_features * lin.out_features for lin in self.layer_linears())
        return per_layer * self.num_hidden_layers

    @property
    def bias_parameters(self) -> int:
        """Projection biases across all layers (kept in 16 bit by every quantizer)."""
        per_layer = sum(lin.out_features for lin in self.layer_linears() if lin.has_bias)
        return per_layer * self.num_hidden_layers

    @property
    def embedding_parameters(self) -> int:
        """embed_tokens plus lm_head (one tensor when tie_word_embeddings)."""
        copies = 1 if self.tie_word_embeddings else 2
        return copies * self.vocab_size * self.hidden_size

    @property
    def norm_parameters(self) -> int:
        """Every RMSNorm weight: per-layer norms plus the final norm."""
        return self.layer_norm_parameters * self.num_hidden_layers + self.hidden_size

    @property
    def parameter_count(self) -> int:
        """Exact parameter count of the architecture (tied embeddings counted once)."""
        return (
            self.linear_parameters
            + self.bias_parameters
            + self.embedding_parameters
            + self.norm_parameters
        )

    def to_dict(self) -> dict[str, Any]:
        """The spec as a JSON-ready mapping (field names are stable)."""
        return {
            "name": self.name,
            "architecture": self.architecture,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "parameter_count": self.parameter_count,
            "torch_dtype": self.torch_dtype,
            "checkpoint_quant_method": self.checkpoint_quant_method,
        }


def _quant_bits_and_group(quant: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """Bits and group size from an AutoAWQ or compressed-tensors ``quantization_config``."""
    if "bits" in quant or "w_bit" in quant:
        bits = quant.get("bits", quant.get("w_bit"))
        group = quant.get("group_size", quant.get("q_group_size"))
        return (int(bits) if bits else None, int(group) if group else None)
    # compressed-tensors: config_groups -> {group_0: {weights: {num_bits, group_size}}}
    groups = quant.get("config_groups") or {}
    for group_cfg in groups.values() if isinstance(groups, Mapping) else ():
        weights = group_cfg.get("weights") if isinstance(group_cfg, Mapping) else None
        if isinstance(weights, Mapping):
            bits = weights.get("num_bits")
            group = weights.get("group_size")
            return (int(bits) if bits else None, int(group) if group else None)
    return (None, None)


def load_model_spec(path: str | Path) -> ModelSpec:
    """Read ``config.json`` at ``path`` (the spec is named after the file's stem)."""
    return ModelSpec.from_hf_config(Path(path))


def _check_supported_shape(raw: Mapping[str, Any]) -> str:
    """The config's architecture, once it is one we size, dense, and has the fields we read."""
    architectures = raw.get("architectures") or []
    architecture: str = architectures[0] if architectures else ""
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ModelSpecError(
            f"architecture {architecture or '(none)'!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    moe = [key for key in _MOE_KEYS if raw.get(key)]
    if moe:
        raise ModelSpecError(
            f"config has mixture-of-experts field {moe[0]!r}; only dense models are supported"
        )
    missing = [key for key in _REQUIRED_KEYS if key not in raw]
    if missing:
        raise ModelSpecError(f"config.json lacks required field(s): {', '.join(missing)}")
    return architecture


def _positive_int(key: str, value: Any) -> int:
    """``value`` if it is a positive integer (``True`` is not); else an error naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelSpecError(f"config field {key!r} must be a positive integer, got {value!r}")
    return value


def _head_dim(head_dim: Any, *, hidden: int, heads: int) -> int:
    """The config's ``head_dim``, or hidden size ÷ attention heads when it gives none."""
    if head_dim is not None:
        return _positive_int("head_dim", head_dim)
    if hidden % heads:
        raise ModelSpecError(
            f"hidden_size ({hidden}) is not divisible by num_attention_heads ({heads}) "
            "and the config gives no head_dim"
        )
    return hidden // heads
