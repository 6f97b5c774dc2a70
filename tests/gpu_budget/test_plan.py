"""The plan's accounting, its engine arguments, and every refusal with its message."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_budget import (
    ENGINE_ARGS,
    ENGINE_ENV_PREFIX,
    EXPECTED_KV_TOKENS_ENV_VAR,
    SEED_EXAMPLE_REQUEST_TOKENS,
    BudgetError,
    InstanceType,
    MemoryPlan,
    ModelSpec,
    compare_engine_report,
    instance_type,
    plan,
    static_vs_paged,
    weights_bytes,
)
from gpu_budget.instances import GIB, MIB
from gpu_budget.planner import NON_TORCH_BYTES_SINGLE_GPU, SAMPLER_LOGITS_COPIES

LLAMA_3_8B = Path(__file__).resolve().parents[2] / "config" / "models" / "llama-3-8b-instruct.json"


@pytest.fixture(scope="module")
def g5_plan(llama8b: ModelSpec) -> MemoryPlan:
    return plan(llama8b, quantization="awq", instance="ml.g5.xlarge", max_model_len=4096)


# --------------------------------------------------------------------------- accounting


def test_readme_plan_accounting(g5_plan: MemoryPlan) -> None:
    p = g5_plan
    assert p.gpu_memory_utilization == 0.84
    assert p.gpu_memory_utilization_source == "sku-rule"
    assert p.gpu_memory_bytes == 23_028 * MIB
    assert p.budget_bytes == int(0.84 * 23_028 * MIB)
    assert p.headroom_bytes == p.gpu_memory_bytes - p.budget_bytes
    assert p.weights_bytes == p.weights_bytes_total == 5_727_854_592
    assert p.kv_bytes_per_token == 131_072
    assert p.block_bytes == 2 * MIB
    assert p.non_torch_bytes == NON_TORCH_BYTES_SINGLE_GPU
    assert p.sampler_bytes == p.max_num_seqs * 128_256 * 4 * SAMPLER_LOGITS_COPIES
    assert p.forward_activation_bytes == 2048 * 2 * (4 * 4096 + 3 * 14336 + 2 * 4096 + 2 * 1024)
    assert p.activation_bytes == max(p.forward_activation_bytes, p.sampler_bytes)
    assert p.reserve_bytes == p.activation_bytes + p.non_torch_bytes
    left = p.budget_bytes - p.weights_bytes - p.lora_bytes - p.reserve_bytes
    assert p.kv_pool_blocks == left // p.block_bytes
    assert p.kv_pool_bytes == p.kv_pool_blocks * p.block_bytes
    assert p.kv_pool_tokens == p.kv_pool_blocks * 16
    assert p.max_concurrency_at_max_len == p.kv_pool_blocks // 256
    assert p.largest_max_model_len == 8192  # the pool holds more; the model stops at 8k
    assert p.max_num_batched_tokens == 2048  # vLLM's default below 70 GiB
    # Recommended max_num_seqs: the most quarter-context (1,024-token) requests that fit,
    # rounded down to a multiple of 8, never above vLLM's 256 default.
    assert p.max_num_seqs_source == "recommended"
    assert p.max_num_seqs % 8 == 0
    assert p.max_num_seqs <= 256
    assert p.max_num_seqs * 64 <= p.kv_pool_blocks < (p.max_num_seqs + 8) * 64 + 64
    assert p.cost_per_hour_usd == instance_type("ml.g5.xlarge").on_demand_usd_per_hour
    assert p.cost_per_month_usd == round(p.cost_per_hour_usd * 730, 2)
    assert p.warnings == ()


def test_readme_plan_numbers_are_stable(g5_plan: MemoryPlan) -> None:
    # The figures docs/gpu-budget.md quotes; a change here must update the document.
    assert (g5_plan.kv_pool_blocks, g5_plan.kv_pool_tokens) == (6628, 106_048)
    assert (g5_plan.max_concurrency_at_max_len, g5_plan.max_num_seqs) == (25, 96)
    assert [b.max_concurrency for b in g5_plan.buckets] == [207, 103, 51, 25]


def test_buckets(g5_plan: MemoryPlan) -> None:
    # The gateway's buckets at the same window (request_buckets): 1/8, 1/4, 1/2 of 4,096, XL above.
    s, m, l_, xl = g5_plan.buckets
    assert (s.bucket, s.sized_tokens, s.blocks_per_sequence) == ("S", 512, 32)
    assert s.max_concurrency == g5_plan.kv_pool_blocks // 32
    assert s.effective_concurrency == min(s.max_concurrency, g5_plan.max_num_seqs)
    assert (m.bucket, m.sized_tokens, m.blocks_per_sequence) == ("M", 1024, 64)
    assert (l_.bucket, l_.sized_tokens, l_.blocks_per_sequence) == ("L", 2048, 128)
    assert (xl.bucket, xl.sized_tokens, xl.max_tokens) == ("XL", 4096, None)
    assert xl.max_concurrency == g5_plan.max_concurrency_at_max_len
    assert all(b.reachable for b in g5_plan.buckets)
    assert all(b.share is None for b in g5_plan.buckets)


def test_budget_buckets_are_the_gateways(g5_plan: MemoryPlan) -> None:
    from request_buckets import BUCKET_NAMES, bucket_bounds

    bounds = bucket_bounds(g5_plan.max_model_len)
    assert tuple(b.bucket for b in g5_plan.buckets) == BUCKET_NAMES
    assert [b.sized_tokens for b in g5_plan.buckets] == [bounds.upper(n) for n in BUCKET_NAMES]


def test_request_lengths_add_mean_and_shares(llama8b: ModelSpec) -> None:
    lengths = [300, 300, 1500, 6000]
    p = plan(llama8b, quantization="awq", instance="ml.g5.xlarge", max_model_len=8192,
             request_lengths=lengths)
    assert p.mean_request_tokens == 2025.0
    mean_blocks = (19 + 19 + 94 + 375) / 4
    assert p.max_concurrency_at_mean == int(p.kv_pool_blocks // mean_blocks)
    # At 8,192 tokens: S ≤ 1,024, M ≤ 2,048, L ≤ 4,096, XL above.
    assert [b.share for b in p.buckets] == [0.5, 0.25, 0.0, 0.25]
    # max_num_seqs is sized by the mean (2,025 → 127 blocks) instead of a quarter context.
    assert p.max_num_seqs * 127 <= p.kv_pool_blocks
    too_long = plan(llama8b, quantization="awq", instance="ml.g5.xlarge", max_model_len=4096,
                    request_lengths=lengths)
    assert any("1 of 4 sampled requests exceed max_model_len 4,096" in w for w in too_long.warnings)


def test_json_has_stable_field_names(g5_plan: MemoryPlan) -> None:
    data = json.loads(g5_plan.to_json())
    for key in (
        "kv_bytes_per_token", "weights_bytes", "lora_bytes", "reserve_bytes", "kv_pool_bytes",
        "kv_pool_tokens", "kv_pool_blocks", "block_size", "gpu_memory_utilization",
        "max_model_len", "max_num_seqs", "max_num_batched_tokens", "max_concurrency_at_max_len",
        "largest_max_model_len", "cost_per_hour_usd", "cost_per_month_usd", "buckets",
        "engine_args", "warnings",
    ):
        assert key in data, key
    assert data["buckets"][0]["bucket"] == "S"


# --------------------------------------------------------------------------- engine args


def test_engine_args_are_vllm_engine_args_fields(g5_plan: MemoryPlan) -> None:
    assert g5_plan.engine_args() == {
        "gpu_memory_utilization": 0.84,
        "max_model_len": 4096,
        "max_num_seqs": g5_plan.max_num_seqs,
        "max_num_batched_tokens": 2048,
        "block_size": 16,
        "kv_cache_dtype": "auto",
        "quantization": "awq_marlin",
        "dtype": "float16",
        "tensor_parallel_size": 1,
        "enable_lora": False,
    }


@pytest.mark.parametrize(
    ("quantization", "instance", "expected", "dtype"),
    [
        ("awq", "ml.g5.xlarge", "awq_marlin", "float16"),  # Ampere: Marlin kernel
        ("awq", "ml.g6.xlarge", "awq_marlin", "float16"),  # Ada
        ("awq", "ml.g4dn.xlarge", "awq", "float16"),  # Turing: no Marlin
        ("w4a16", "ml.g5.xlarge", "compressed-tensors", "auto"),  # llm-compressor output
        ("int8", "ml.g5.xlarge", "compressed-tensors", "auto"),
        ("bf16", "ml.g6e.xlarge", None, "auto"),
        ("fp16", "ml.g6e.xlarge", None, "float16"),
    ],
)
def test_quantization_engine_argument(llama8b: ModelSpec, quantization: str, instance: str,
                                      expected: str | None, dtype: str) -> None:
    p = plan(llama8b, quantization=quantization, instance=instance, max_model_len=2048)
    assert p.engine_args()["quantization"] == expected
    assert p.engine_args()["dtype"] == dtype


def test_lora_engine_args_and_budget(llama8b: ModelSpec, g5_plan: MemoryPlan) -> None:
    p = plan(llama8b, quantization="awq", instance="ml.g5.xlarge", max_model_len=4096,
             max_loras=4, max_lora_rank=64)
    args = p.engine_args()
    assert (args["enable_lora"], args["max_loras"], args["max_lora_rank"]) == (True, 4, 64)
    assert args["max_cpu_loras"] == 8
    assert p.lora_bytes == 1_409_941_504
    assert p.kv_pool_bytes < g5_plan.kv_pool_bytes - p.lora_bytes + p.block_bytes * 64
    explicit = plan(llama8b, quantization="awq", instance="ml.g5.xlarge", max_model_len=4096,
                    max_loras=2, max_lora_rank=16, max_cpu_loras=3)
    assert explicit.engine_args()["max_cpu_loras"] == 3


def test_engine_env_round_trip(g5_plan: MemoryPlan) -> None:
    env = g5_plan.engine_env({"enable_prefix_caching": True, "max_num_queued_reqs": None})
    assert env[EXPECTED_KV_TOKENS_ENV_VAR] == str(g5_plan.kv_pool_tokens)
    assert env["ENGINE_MAX_MODEL_LEN"] == "4096"
    assert env["ENGINE_ENABLE_PREFIX_CACHING"] == "true"
    assert "ENGINE_MAX_NUM_QUEUED_REQS" not in env  # None is left out
    assert all(k.startswith(ENGINE_ENV_PREFIX) for k in env if k != EXPECTED_KV_TOKENS_ENV_VAR)
    expected = {k: v for k, v in g5_plan.engine_args().items() if v is not None}
    expected["enable_prefix_caching"] = True
    # each variable read back by its row of the engine-argument table gives the plan's value
    assert {arg.field: arg.parse(env[arg.env]) for arg in ENGINE_ARGS if arg.env in env} \
        == expected
    assert set(env) - {arg.env for arg in ENGINE_ARGS} == {EXPECTED_KV_TOKENS_ENV_VAR}
    with pytest.raises(ValueError, match="'swap_space' is not an engine argument"):
        g5_plan.engine_env({"swap_space": 4})


def test_tensor_parallel_plan(llama70b: ModelSpec) -> None:
    p = plan(llama70b, quantization="awq", instance="ml.g5.12xlarge", max_model_len=4096,
             tensor_parallel_size=4)
    assert p.weights_bytes == weights_bytes(llama70b, "awq", tensor_parallel_size=4)
    assert p.kv_bytes_per_token == 327_680 // 4
    assert p.non_torch_bytes > NON_TORCH_BYTES_SINGLE_GPU
    assert p.engine_args()["tensor_parallel_size"] == 4
    half = plan(llama70b, quantization="awq", instance="ml.g5.48xlarge", max_model_len=4096,
                tensor_parallel_size=4)
    assert any("uses 4 of ml.g5.48xlarge's 8 GPUs" in w for w in half.warnings)


def test_checkpoint_quantization_config_decides_when_unset(llama8b: ModelSpec) -> None:
    raw = json.loads(LLAMA_3_8B.read_text())
    raw["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 64,
                                  "zero_point": True, "version": "gemm"}
    awq_spec = ModelSpec.from_hf_config(raw, name="llama-3-8b-awq")
    p = plan(awq_spec, quantization=None, instance="ml.g5.xlarge", max_model_len=4096)
    assert p.quantization == "awq int4 g64"
    assert p.engine_args()["quantization"] == "awq_marlin"
    assert p.weights_bytes == weights_bytes(llama8b, "awq-g64")
    error = _refusal(model=awq_spec, quantization="bf16", instance="ml.g5.xlarge",
                     max_model_len=4096)
    assert error.kind == "invalid-setting"
    assert "quantization 'bf16' contradicts llama-3-8b-awq's config.json" in str(error)
    assert plan(llama8b, quantization=None, instance="ml.g5.xlarge",
                max_model_len=4096).quantization == "bf16"


# --------------------------------------------------------------------------- refusals


def _refusal(**kwargs: object) -> BudgetError:
    with pytest.raises(BudgetError) as caught:
        plan(**kwargs)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "\n" not in message  # one readable paragraph
    return caught.value


def test_70b_bf16_on_g5_xlarge_is_refused_with_numbers_and_fixes(llama70b: ModelSpec) -> None:
    error = _refusal(model=llama70b, quantization="bf16", instance="ml.g5.xlarge",
                     max_model_len=4096)
    message = str(error)
    assert error.kind == "weights"
    assert "llama-3-70b-instruct (bf16, max_model_len 4,096) does not fit ml.g5.xlarge" in message
    assert "its weights need 131.4 GiB per GPU but vLLM's budget is 18.9 GiB" in message
    assert "0.84 × 22.5 GiB NVIDIA A10G" in message
    assert "quantize to AWQ int4 (weights 37.0 GiB per GPU, not enough on its own here" in message
    assert "more tensor parallelism needs a multi-GPU instance" in message
    assert "use a larger instance: " in message
    assert "with tensor_parallel_size" in message


def test_weights_fit_with_more_tensor_parallelism_is_suggested(llama70b: ModelSpec) -> None:
    error = _refusal(model=llama70b, quantization="awq", instance="ml.g5.12xlarge",
                     max_model_len=4096, tensor_parallel_size=2)
    # 70B AWQ halves to 18.5 GiB per A10G: the weights squeeze into the 18.9 GiB budget, the
    # reserve does not.
    assert error.kind == "no-kv-room"
    assert "weights (18.5 GiB) + activation/sampler reserve" in str(error)
    assert "use more tensor parallelism: tensor_parallel_size 4 on this instance" in str(error)
    # The suggestion is real: that plan exists.
    assert plan(llama70b, quantization="awq", instance="ml.g5.12xlarge", max_model_len=4096,
                tensor_parallel_size=4).kv_pool_tokens > 4096


def test_max_model_len_that_cannot_fit_one_sequence(llama8b: ModelSpec) -> None:
    error = _refusal(model=llama8b, quantization="awq", instance="ml.g5.xlarge",
                     max_model_len=8192, gpu_memory_utilization=0.30)
    message = str(error)
    assert error.kind == "max-model-len"
    assert "one 8,192-token sequence needs 1.0 GiB of KV cache (131,072 B/token)" in message
    fitting = plan(llama8b, quantization="awq", instance="ml.g5.xlarge", max_model_len=4096,
                   gpu_memory_utilization=0.30)
    assert f"lower max_model_len to at most {fitting.kv_pool_tokens:,} tokens" in message
    assert fitting.largest_max_model_len == fitting.kv_pool_tokens < 8192


def test_no_room_left_for_any_kv(llama8b: ModelSpec) -> None:
    error = _refusal(model=llama8b, quantization="awq", instance="ml.g5.xlarge",
                     max_model_len=1024, gpu_memory_utilization=0.25)
    assert error.kind == "no-kv-room"
    assert "leave no KV cache in vLLM's 5.6 GiB budget (0.25 × 22.5 GiB NVIDIA A10G)" in str(error)


def test_max_num_seqs_beyond_what_the_pool_holds(llama8b: ModelSpec) -> None:
    error = _refusal(model=llama8b, quantization="awq", instance="ml.g5.xlarge",
                     max_model_len=4096, max_num_seqs=900, max_num_batched_tokens=2048)
    assert error.kind == "max-num-seqs"
    message = str(error)
    assert "max_num_seqs 900 exceeds what the KV pool" in message
    assert "even at 256 tokens per sequence" in message
    assert "lower max_num_seqs to at most" in message


def test_batched_tokens_beyond_the_pool(llama1b: ModelSpec) -> None:
    error = _refusal(model=llama1b, quantization="bf16", instance="ml.g5.xlarge",
                     max_model_len=4096, max_num_batched_tokens=170_000)
    assert error.kind == "max-num-batched-tokens"
    assert "max_num_batched_tokens 170,000 exceeds the whole KV pool" in str(error)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"gpu_memory_utilization": 0.97}, "outside the safe range (0, 0.95]"),
        ({"gpu_memory_utilization": 0.0}, "outside the safe range"),
        ({"block_size": 24}, "block_size 24 is not one vLLM's CUDA attention backends accept"),
        ({"kv_cache_dtype": "int4"}, "kv_cache_dtype 'int4' is not supported"),
        ({"tensor_parallel_size": 2}, "needs 2 GPUs but ml.g5.xlarge has 1"),
        ({"max_loras": 4, "max_lora_rank": 48}, "max_lora_rank 48 is not one vLLM accepts"),
        ({"max_lora_rank": 16}, "max_loras is 0"),
        ({"max_loras": 4, "max_lora_rank": 16, "max_cpu_loras": 2}, "must be at least max_loras"),
        ({"max_num_seqs": 300, "max_num_batched_tokens": 256}, "must be at least max_num_seqs"),
        ({"max_model_len": 16384}, "exceeds llama-3-8b-instruct's max_position_embeddings"),
        ({"max_model_len": 0}, "max_model_len must be a positive token count"),
        ({"instance": "ml.inf2.xlarge"}, "is an Inferentia instance"),
        ({"instance": "ml.g4dn.xlarge", "quantization": "bf16"}, "has no bfloat16"),
        ({"instance": "ml.g9.xlarge"}, "not in the catalog; known: ml.g4dn.xlarge"),
        ({"quantization": "gptq"}, "quantization 'gptq' is not known"),
        ({"request_lengths": [10, -1]}, "request length #2 must be a positive integer"),
    ],
)
def test_invalid_settings_are_refused(llama8b: ModelSpec, overrides: dict[str, object],
                                      fragment: str) -> None:
    kwargs: dict[str, object] = {"model": llama8b, "quantization": "awq",
                                 "instance": "ml.g5.xlarge", "max_model_len": 4096}
    kwargs.update(overrides)
    error = _refusal(**kwargs)
    assert error.kind == "invalid-setting"
    assert fragment in str(error)


def test_setting_checks_are_a_table_run_in_order(llama8b: ModelSpec) -> None:
    """Each check guards one of plan()'s arguments; the first that applies is the refusal."""
    import inspect

    from gpu_budget.planner import SETTING_CHECKS

    assert {check.field for check in SETTING_CHECKS} <= set(inspect.signature(plan).parameters)
    fields = [check.field for check in SETTING_CHECKS]
    assert fields.index("block_size") < fields.index("kv_cache_dtype") < fields.index(
        "max_lora_rank")
    error = _refusal(model=llama8b, quantization="awq", instance="ml.g5.xlarge",
                     max_model_len=4096, block_size=24, kv_cache_dtype="int4", max_lora_rank=48)
    assert "block_size 24" in str(error) and "kv_cache_dtype" not in str(error)


def test_the_planner_keeps_its_public_names() -> None:
    """Split into modules, gpu_budget.planner still offers every name its callers import."""
    import gpu_budget
    import gpu_budget.planner as planner

    assert all(hasattr(planner, name) for name in planner.__all__)
    assert {"BudgetError", "MemoryPlan", "BucketConcurrency", "plan",
            "vllm_quantization_for", "EXPECTED_KV_TOKENS_ENV_VAR"} <= set(planner.__all__)
    assert all(getattr(gpu_budget, name) is getattr(planner, name)
               for name in ("BudgetError", "MemoryPlan", "plan"))
    assert not hasattr(planner, "validate"), "one name for the planner: plan"


def test_the_docs_map_every_module() -> None:
    root = LLAMA_3_8B.parents[2]
    docs = (root / "docs" / "gpu-budget.md").read_text(encoding="utf-8")
    section = docs[docs.index("## Where the code is"):]
    missing = [path.name for path in sorted((root / "gpu_budget").glob("*.py"))
               if not path.name.startswith("__") and f"`{path.name}`" not in section]
    assert not missing, f"docs/gpu-budget.md's module table lacks {missing}"


def test_tensor_parallel_split_refused(llama8b: ModelSpec) -> None:
    error = _refusal(model=llama8b, quantization="awq", instance="ml.g5.48xlarge",
                     max_model_len=4096, tensor_parallel_size=3)
    assert "32 attention heads cannot be split across 3 GPUs" in str(error)


def test_explicit_utilization_above_the_sku_rule_warns(llama8b: ModelSpec) -> None:
    p = plan(llama8b, quantization="awq", instance="ml.g5.xlarge", max_model_len=4096,
             gpu_memory_utilization=0.92)
    assert p.gpu_memory_utilization_source == "explicit"
    assert any("0.92 is above the NVIDIA A10G rule (0.84)" in w for w in p.warnings)


def test_a_gpu_outside_the_catalog(llama8b: ModelSpec,
                                   make_gpu: Callable[..., InstanceType]) -> None:
    p = plan(llama8b, quantization="awq", instance=make_gpu(48 * GIB), max_model_len=8192)
    assert p.instance_type == "test.gpu"
    assert p.gpu_memory_utilization == 0.92


# --------------------------------------------------------------------------- engine report


def test_compare_engine_report(g5_plan: MemoryPlan) -> None:
    same = compare_engine_report(g5_plan, g5_plan.kv_pool_blocks, 16)
    assert same.relative_difference == 0
    assert same.within_tolerance
    low = compare_engine_report(g5_plan, int(g5_plan.kv_pool_blocks * 0.88), 16)
    assert not low.within_tolerance
    assert low.relative_difference < -0.10
    assert "fewer, outside the 10% tolerance" in low.message
    high = compare_engine_report(g5_plan, int(g5_plan.kv_pool_blocks * 1.05), 16)
    assert high.within_tolerance
    assert "more, within" in high.message
    # A different block size is compared in tokens.
    other = compare_engine_report(g5_plan.kv_pool_tokens, g5_plan.kv_pool_blocks // 2, 32)
    assert other.engine_kv_tokens == g5_plan.kv_pool_blocks // 2 * 32
    assert abs(other.relative_difference) < 0.001
    with pytest.raises(ValueError, match="num_gpu_blocks must be a positive integer"):
        compare_engine_report(g5_plan, 0, 16)
    assert same.to_dict()["planned_kv_tokens"] == g5_plan.kv_pool_tokens


# --------------------------------------------------------------------------- static vs paged


def test_static_vs_paged_on_the_seed_example(llama8b: ModelSpec) -> None:
    p = plan(llama8b, quantization="awq", instance="ml.g5.xlarge", max_model_len=2048)
    result = static_vs_paged(p, SEED_EXAMPLE_REQUEST_TOKENS)
    assert result.mean_request_tokens == 573.0
    assert result.static_waste_fraction == round(1 - 573 / 2048, 4) == 0.7202  # the seed's 72 %
    blocks = [-(-n // 16) for n in SEED_EXAMPLE_REQUEST_TOKENS]
    assert result.paged_reserved_tokens_per_request == round(sum(blocks) / 10 * 16, 1)
    assert result.paged_waste_fraction < 0.02
    assert result.static_concurrency == p.kv_pool_tokens // 2048
    assert result.paged_concurrency == int(p.kv_pool_blocks // (sum(blocks) / 10))
    assert result.concurrency_ratio == round(result.paged_concurrency / result.static_concurrency,
                                             2)
    assert 3.3 < result.concurrency_ratio < 3.7
    assert len(result.assumptions) == 5
    with pytest.raises(ValueError, match="exceed max_model_len 2,048"):
        static_vs_paged(p, [100, 4000])


def test_scheduler_defaults_follow_vllm_by_gpu(llama8b: ModelSpec) -> None:
    h100 = plan(llama8b, quantization="awq", instance="ml.p5.48xlarge", max_model_len=2048)
    assert h100.max_num_batched_tokens == 8192
    assert h100.max_num_seqs == 1024  # the pool holds more; vLLM's H100 default caps it
    # vLLM keeps A100s on the small defaults even with 80 GB (its PR #17885).
    a100 = plan(llama8b, quantization="awq", instance="ml.p4de.24xlarge", max_model_len=2048)
    assert a100.max_num_batched_tokens == 2048
    assert a100.max_num_seqs == 256
