"""Exact KV, weight, LoRA and block arithmetic, and the instance catalog."""

from __future__ import annotations

import pytest

from gpu_budget import (
    INSTANCE_CATALOG,
    ModelSpec,
    UnknownInstanceTypeError,
    blocks_for_tokens,
    gpu_memory_utilization_for,
    instance_type,
    kv_block_bytes,
    kv_bytes_per_token,
    kv_pool_tokens,
    lora_bytes,
    parse_quantization,
    weights_bytes,
)
from gpu_budget.instances import GIB, MIB, OUTSIDE_BUDGET_HEADROOM_BYTES
from gpu_budget.lengths import RequestLengthDistribution
from gpu_budget.weights import padded_vocab
from request_buckets import bucket_bounds

# ----------------------------------------------------------------------------- KV cache


def test_llama_3_8b_bf16_kv_is_exactly_131072_bytes_per_token(llama8b: ModelSpec) -> None:
    assert kv_bytes_per_token(llama8b) == 32 * 8 * 2 * 128 * 2 == 131_072
    assert kv_bytes_per_token(llama8b, "bfloat16") == 131_072


def test_kv_under_tensor_parallelism_and_fp8(llama8b: ModelSpec) -> None:
    assert kv_bytes_per_token(llama8b, tensor_parallel_size=2) == 65_536
    assert kv_bytes_per_token(llama8b, tensor_parallel_size=8) == 16_384
    # More GPUs than KV heads: vLLM replicates, each GPU still holds one head.
    assert kv_bytes_per_token(llama8b, tensor_parallel_size=16) == 16_384
    assert kv_bytes_per_token(llama8b, "fp8") == 65_536
    assert kv_block_bytes(llama8b, block_size=16) == 16 * 131_072 == 2 * MIB


def test_kv_other_models(llama70b: ModelSpec, llama1b: ModelSpec) -> None:
    assert kv_bytes_per_token(llama70b) == 80 * 8 * 2 * 128 * 2 == 327_680
    assert kv_bytes_per_token(llama1b) == 16 * 8 * 2 * 64 * 2 == 32_768


def test_unknown_kv_dtype_lists_accepted(llama8b: ModelSpec) -> None:
    with pytest.raises(ValueError, match="accepted: auto, bfloat16, fp8"):
        kv_bytes_per_token(llama8b, "int4")


def test_a_pool_holds_whole_blocks_only(llama8b: ModelSpec) -> None:
    block = kv_block_bytes(llama8b, block_size=16)  # 16 x 131,072 B = 2 MiB
    assert kv_pool_tokens(llama8b, 10 * block, block_size=16) == 160
    assert kv_pool_tokens(llama8b, 10 * block + block - 1, block_size=16) == 160
    assert kv_pool_tokens(llama8b, GIB, block_size=16) == 8192
    assert kv_pool_tokens(llama8b, GIB, block_size=16, kv_cache_dtype="fp8") == 16384
    with pytest.raises(ValueError, match="pool_bytes must be >= 0"):
        kv_pool_tokens(llama8b, -1)


def test_paged_rounding_to_whole_blocks() -> None:
    assert [blocks_for_tokens(n, 16) for n in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]
    assert blocks_for_tokens(4096, 16) == 256
    assert blocks_for_tokens(4097, 16) == 257
    assert blocks_for_tokens(100, 32) == 4
    for tokens, block_size in ((-1, 16), (16, 0)):  # one rule, the gateway's admission's too
        with pytest.raises(ValueError, match="tokens must be >= 0 and block_size >= 1"):
            blocks_for_tokens(tokens, block_size)


# ----------------------------------------------------------------------------- weights


def test_llama_3_8b_bf16_weights_are_16_06_gb(llama8b: ModelSpec) -> None:
    total = weights_bytes(llama8b, "bf16")
    assert total == 8_030_261_248 * 2 == 16_060_522_496
    assert round(total / 1e9, 2) == 16.06


def test_llama_3_8b_awq_is_in_the_5_to_6_gb_range(llama8b: ModelSpec) -> None:
    awq = weights_bytes(llama8b, "awq")
    # Packed int4 projections + fp16 scales + 4-bit zeros per 128-group, 16-bit embeddings,
    # lm_head and norms: computed by hand from the tensor shapes.
    linear = llama8b.linear_parameters
    assert linear == 6_979_321_856
    expected = (
        linear // 2  # qweight
        + linear // 128 * 2  # scales
        + linear // 128 // 2  # qzeros
        + 2 * 128_256 * 4096 * 2  # embed_tokens + lm_head in fp16
        + (32 * 2 * 4096 + 4096) * 2  # RMSNorm weights
    )
    assert awq == expected == 5_727_854_592
    assert 5e9 <= awq <= 6e9
    assert weights_bytes(llama8b, "awq") / weights_bytes(llama8b, "bf16") < 0.40  # ≥ 60 % less


def test_group_64_costs_more_than_group_128_and_int8_sits_between(llama8b: ModelSpec) -> None:
    g128 = weights_bytes(llama8b, "awq-g128")
    g64 = weights_bytes(llama8b, "awq-g64")
    int8 = weights_bytes(llama8b, "int8")
    bf16 = weights_bytes(llama8b, "bf16")
    assert g128 < g64 < int8 < bf16
    assert g64 - g128 == llama8b.linear_parameters // 128 * (2 + 0.5)  # twice the groups
    assert weights_bytes(llama8b, "w4a16") == g128  # same tensors, other layout


def test_tensor_parallel_shards_sum_to_the_whole(llama8b: ModelSpec) -> None:
    total = weights_bytes(llama8b, "bf16")
    norms = llama8b.norm_parameters * 2
    for tp in (2, 4, 8):
        per_gpu = weights_bytes(llama8b, "bf16", tensor_parallel_size=tp)
        # Everything is split except the RMSNorm weights, which every GPU holds, and the
        # vocabulary is padded to a multiple of 64 × tp first (128,256 → 128,512 at tp 8).
        padding_rows = padded_vocab(llama8b.vocab_size, tp) * tp - llama8b.vocab_size
        padding = 2 * padding_rows * llama8b.hidden_size * 2  # embed_tokens and lm_head
        assert per_gpu * tp == total + (tp - 1) * norms + padding
        assert (padding_rows == 0) == (tp < 8)


def test_kv_projection_replication_beyond_kv_heads(llama8b: ModelSpec) -> None:
    # At tp=16 each GPU holds one of the 8 KV heads twice over: k/v shards don't shrink further.
    tp8 = weights_bytes(llama8b, "bf16", tensor_parallel_size=8)
    with pytest.raises(ValueError, match="32 attention heads cannot be split across 3 GPUs"):
        weights_bytes(llama8b, "bf16", tensor_parallel_size=3)
    assert tp8 > 0


def test_unknown_quantization_lists_choices(llama8b: ModelSpec) -> None:
    with pytest.raises(ValueError, match="accepted: bf16, fp16, int8, awq"):
        weights_bytes(llama8b, "gptq")
    assert parse_quantization(None).name == "bf16"
    assert parse_quantization("compressed-tensors").checkpoint_quant_method == "compressed-tensors"


# ----------------------------------------------------------------------------- LoRA


def test_lora_slots_formula(llama8b: ModelSpec) -> None:
    rank, slots = 64, 4
    per_layer = (
        3 * rank * 4096 + rank * (4096 + 2 * 1024)  # qkv_proj: 3 lora_a slices, packed lora_b
        + rank * 4096 + 4096 * rank  # o_proj
        + 2 * rank * 4096 + rank * 2 * 14336  # gate_up_proj
        + rank * 14336 + 4096 * rank  # down_proj
    )
    embedding = 128_256 * rank + 4096 * rank
    expected = slots * 2 * (32 * per_layer + embedding)
    assert lora_bytes(llama8b, slots, rank) == expected == 1_409_941_504
    assert lora_bytes(llama8b, 0, 64) == 0
    assert lora_bytes(llama8b, 8, 64) == 2 * expected


# ----------------------------------------------------------------------------- catalog


def test_catalog_rows_are_complete() -> None:
    families = {name.split(".")[1] for name in INSTANCE_CATALOG}
    assert {"g5", "g6", "g6e", "g4dn", "p4d", "p4de", "p5", "inf1", "inf2"} <= families
    for inst in INSTANCE_CATALOG.values():
        assert inst.on_demand_usd_per_hour > 0
        assert inst.price_basis in {"list", "derived"}
        assert inst.prices_compiled_on == "2026-11-22"
        assert inst.price_region == "ap-northeast-1"
        if inst.accelerator_kind == "gpu":
            assert inst.compute_capability is not None
            assert inst.neuron_cores is None
            assert inst.gpu_count == inst.accelerator_count
        else:
            assert inst.accelerator_kind == "inferentia"
            assert inst.compute_capability is None
            assert inst.neuron_cores
            assert inst.gpu_count == 0


def test_known_skus() -> None:
    g5 = instance_type("ml.g5.xlarge")
    assert (g5.gpu_model, g5.gpu_count, g5.compute_capability) == ("NVIDIA A10G", 1, (8, 6))
    assert g5.memory_per_accelerator_bytes == 23_028 * MIB
    assert instance_type("ml.g5.48xlarge").gpu_count == 8
    assert instance_type("ml.g4dn.xlarge").memory_per_accelerator_bytes == 15_360 * MIB
    assert instance_type("ml.p5.48xlarge").compute_capability == (9, 0)
    inf1 = instance_type("ml.inf1.xlarge")
    assert (inf1.neuron_cores, inf1.memory_per_accelerator_bytes) == (4, 8 * GIB)
    assert instance_type("ml.inf2.48xlarge").neuron_cores == 24
    assert g5.on_demand_usd_per_month == round(g5.on_demand_usd_per_hour * 730, 2)


def test_unknown_instance_lists_known_ones() -> None:
    with pytest.raises(UnknownInstanceTypeError) as caught:
        instance_type("ml.g9.xlarge")
    text = str(caught.value)
    assert "'ml.g9.xlarge' is not in the catalog" in text
    assert "ml.g5.xlarge" in text
    assert "ml.inf2.xlarge" in text
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, KeyError)


def test_sku_utilization_rule() -> None:
    assert gpu_memory_utilization_for(23_028 * MIB) == 0.84  # A10G
    assert gpu_memory_utilization_for(23_034 * MIB) == 0.84  # L4
    assert gpu_memory_utilization_for(15_360 * MIB) == 0.76  # T4: lower under 20 GiB
    assert gpu_memory_utilization_for(46_068 * MIB) == 0.92  # L40S
    assert gpu_memory_utilization_for(81_559 * MIB) == 0.95  # H100: the cap
    assert gpu_memory_utilization_for(141 * GIB) == 0.95
    with pytest.raises(ValueError, match="leaves nothing"):
        gpu_memory_utilization_for(OUTSIDE_BUDGET_HEADROOM_BYTES)


# ----------------------------------------------------------------------------- lengths


def test_buckets_and_distribution() -> None:
    bounds = bucket_bounds(8192)  # S ≤ 1,024, M ≤ 2,048, L ≤ 4,096, XL above
    assert [bounds.classify(n).value for n in (1, 1024, 1025, 2048, 2049, 4096, 4097)] == [
        "S", "S", "M", "M", "L", "L", "XL"
    ]
    dist = RequestLengthDistribution.from_samples([100, 1600, 3000, 9000])
    assert dist.mean_tokens == 3425
    assert dist.bucket_shares(bounds) == {"S": 0.25, "M": 0.25, "L": 0.25, "XL": 0.25}
    assert dist.percentile_tokens(0.5) == 1600
    assert dist.percentile_tokens(1.0) == 9000
    assert dist.mean_blocks(16) == (7 + 100 + 188 + 563) / 4
    assert dist.count_longer_than(4096) == 1
    with pytest.raises(ValueError, match="#2 must be a positive integer"):
        RequestLengthDistribution.from_samples([10, 0])
    with pytest.raises(ValueError, match="at least one"):
        RequestLengthDistribution.from_samples([])
