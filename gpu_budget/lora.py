"""GPU memory that vLLM preallocates for multi-LoRA serving.

With ``enable_lora`` vLLM wraps every LoRA-capable layer and, at start-up, allocates
``max_loras`` zero-filled adapter slots at ``max_lora_rank`` whether or not adapters are loaded
(``vllm/lora/layers/base_linear.py`` ``create_lora_weights``): per layer and per packed slice a
``lora_a`` of ``[max_loras, 1, rank, input_size]`` and a ``lora_b`` of
``[max_loras, 1, output_size, rank]`` in the LoRA dtype (the model dtype, 2 bytes). The budget
counts, per decoder layer:

* ``qkv_proj`` (column-parallel, 3 slices): lora_a ``3 × rank × hidden``;
  lora_b ``rank × (q + k + v output features per GPU)``
* ``o_proj`` (row-parallel): lora_a ``rank × q features per GPU``; lora_b ``hidden × rank``
* ``gate_up_proj`` (column-parallel, 2 slices): lora_a ``2 × rank × hidden``;
  lora_b ``rank × 2 × intermediate per GPU``
* ``down_proj`` (row-parallel): lora_a ``rank × intermediate per GPU``; lora_b ``hidden × rank``

plus the ``embed_tokens`` buffers of ``VocabParallelEmbeddingWithLoRA``
(``[max_loras, vocab, rank]`` and ``[max_loras, 1, hidden, rank]``), which vLLM allocates when
the architecture registers the embedding as LoRA-capable; counting them always keeps the
budget on the safe side. Total = ``max_loras × 2 B × (layers × per-layer + embedding)``.
Llama-3-8B, 4 slots at rank 64: 1.31 GiB — a real bite out of a 24 GB A10G's KV pool.
"""

from __future__ import annotations

from gpu_budget.engine_args import MAX_LORA_RANKS
from gpu_budget.kv import kv_heads_per_gpu
from gpu_budget.model_spec import ModelSpec

ALLOWED_LORA_RANKS: tuple[int, ...] = MAX_LORA_RANKS
"""vLLM's accepted ``max_lora_rank`` values: the engine-argument table's
(:data:`gpu_budget.engine_args.MAX_LORA_RANKS`)."""

LORA_DTYPE_BYTES = 2


def lora_elements_per_slot(
    model: ModelSpec, max_lora_rank: int, tensor_parallel_size: int = 1
) -> int:
    """Elements one adapter slot occupies on one GPU at ``max_lora_rank``."""
    tp = tensor_parallel_size
    rank = max_lora_rank
    hidden = model.hidden_size
    q_per_gpu = model.q_size // tp
    kv_per_gpu = kv_heads_per_gpu(model, tp) * model.head_dim
    inter_per_gpu = model.intermediate_size // tp
    qkv = 3 * rank * hidden + rank * (q_per_gpu + 2 * kv_per_gpu)
    o_proj = rank * q_per_gpu + hidden * rank
    gate_up = 2 * rank * hidden + rank * 2 * inter_per_gpu
    down = rank * inter_per_gpu + hidden * rank
    per_layer = qkv + o_proj + gate_up + down
    embedding = model.vocab_size * rank + hidden * rank
    return per_layer * model.num_hidden_layers + embedding


def lora_bytes(
    model: ModelSpec, max_loras: int, max_lora_rank: int, tensor_parallel_size: int = 1
) -> int:
    """Bytes vLLM preallocates on one GPU for ``max_loras`` slots (0 when LoRA is off)."""
    if max_loras <= 0:
        return 0
    return (
        max_loras
        * LORA_DTYPE_BYTES
        * lora_elements_per_slot(model, max_lora_rank, tensor_parallel_size)
    )
