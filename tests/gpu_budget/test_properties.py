"""Properties the budget must keep for any model shape and GPU (hypothesis).

"With the same settings" means explicit gpu_memory_utilization, max_num_seqs and
max_num_batched_tokens: those size vLLM's reserve, and a plan that picks them itself may trade a
few sequences of concurrency for a bigger sampler reserve.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from gpu_budget import (
    BudgetError,
    InstanceType,
    MemoryPlan,
    ModelSpec,
    gpu_memory_utilization_for,
    plan,
    weights_bytes,
)
from gpu_budget.instances import GIB, OUTSIDE_BUDGET_HEADROOM_BYTES

PROPERTY_SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def model_specs(draw: st.DrawFn) -> ModelSpec:
    """Dense decoder shapes like the Llama/Qwen families, divisible as real ones are."""
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 4, 8]))
    head_dim = draw(st.sampled_from([64, 128]))
    hidden = heads * head_dim
    assume(hidden % 128 == 0)  # real widths are whole 128-wide quantization groups
    return ModelSpec(
        name="hypothetical",
        architecture=draw(st.sampled_from(["LlamaForCausalLM", "Qwen2ForCausalLM"])),
        num_hidden_layers=draw(st.integers(1, 96)),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        intermediate_size=128 * draw(st.integers(1, 240)),
        vocab_size=draw(st.integers(1000, 160_000)),
        tie_word_embeddings=draw(st.booleans()),
        max_position_embeddings=131_072,
        qkv_bias=draw(st.booleans()),
    )


def _plan_or_none(*, record: bool = True, **kwargs: object) -> MemoryPlan | None:
    """The plan, or None when refused for capacity (an invalid setting fails the test)."""
    try:
        fitted = plan(**kwargs)  # type: ignore[arg-type]
    except BudgetError as error:
        if error.kind == "invalid-setting":  # the strategies only generate valid settings
            raise
        if record:
            event(f"refused: {error.kind}")
        return None
    if record:
        event("fits")
    return fitted


@PROPERTY_SETTINGS
@given(
    model=model_specs(),
    quantization=st.sampled_from(["bf16", "awq", "int8"]),
    memory_gib=st.floats(4, 100),
    extra_gib=st.floats(0, 60),
    utilization=st.floats(0.5, 0.95),
    max_model_len=st.integers(256, 16_384),
    max_num_seqs=st.integers(1, 256),
)
def test_more_memory_never_lowers_concurrency(
    make_gpu: Callable[..., InstanceType], model: ModelSpec, quantization: str,
    memory_gib: float, extra_gib: float, utilization: float, max_model_len: int,
    max_num_seqs: int,
) -> None:
    common = {
        "model": model, "quantization": quantization, "max_model_len": max_model_len,
        "gpu_memory_utilization": round(utilization, 2), "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": 2048 if max_num_seqs <= 2048 else max_num_seqs,
    }
    smaller = _plan_or_none(instance=make_gpu(int(memory_gib * GIB)), **common)
    larger = _plan_or_none(instance=make_gpu(int((memory_gib + extra_gib) * GIB)), **common)
    if smaller is not None:
        assert larger is not None, "a configuration that fits must fit a bigger GPU"
        assert larger.max_concurrency_at_max_len >= smaller.max_concurrency_at_max_len
        assert larger.kv_pool_tokens >= smaller.kv_pool_tokens


@PROPERTY_SETTINGS
@given(
    model=model_specs(),
    memory_gib=st.floats(4, 100),
    short=st.integers(16, 65_536),
    extra=st.integers(0, 65_536),
    max_num_seqs=st.integers(1, 128),
)
def test_longer_context_never_raises_concurrency(
    make_gpu: Callable[..., InstanceType], model: ModelSpec, memory_gib: float, short: int,
    extra: int, max_num_seqs: int,
) -> None:
    gpu = make_gpu(int(memory_gib * GIB))
    common = {
        "model": model, "quantization": "awq", "instance": gpu, "gpu_memory_utilization": 0.9,
        "max_num_seqs": max_num_seqs, "max_num_batched_tokens": 2048,
    }
    shorter = _plan_or_none(max_model_len=short, **common)
    longer = _plan_or_none(max_model_len=short + extra, **common)
    if longer is not None:
        assert shorter is not None, "if the longer context fits, the shorter one must"
        assert longer.max_concurrency_at_max_len <= shorter.max_concurrency_at_max_len
    # Over one plan, concurrency falls (weakly) as the sequence grows.
    if shorter is not None:
        assert shorter.concurrency_at(short + extra) <= shorter.concurrency_at(short)


@PROPERTY_SETTINGS
@given(model=model_specs(), tp=st.sampled_from([1, 2, 4, 8]))
def test_quantizing_never_raises_weight_bytes(model: ModelSpec, tp: int) -> None:
    assume(model.num_attention_heads % tp == 0)
    assume(model.num_key_value_heads % tp == 0 or tp % model.num_key_value_heads == 0)
    assume(model.intermediate_size % (tp * 128) == 0 and model.q_size % (tp * 128) == 0)
    sizes = {
        name: weights_bytes(model, name, tensor_parallel_size=tp)
        for name in ("bf16", "int8", "awq-g64", "awq-g128", "w4a16-g128")
    }
    assert sizes["awq-g128"] <= sizes["awq-g64"] <= sizes["int8"] <= sizes["bf16"]
    assert sizes["w4a16-g128"] <= sizes["int8"]
    assert sizes["bf16"] == weights_bytes(model, "fp16", tensor_parallel_size=tp)


@PROPERTY_SETTINGS
@given(
    smaller=st.integers(OUTSIDE_BUDGET_HEADROOM_BYTES + 1, 200 * GIB),
    extra=st.integers(0, 100 * GIB),
)
def test_sku_rule_grows_with_memory_and_stays_capped(smaller: int, extra: int) -> None:
    low = gpu_memory_utilization_for(smaller)
    high = gpu_memory_utilization_for(smaller + extra)
    assert 0 <= low <= high <= 0.95
    assert low * smaller <= high * (smaller + extra)  # the budget itself never shrinks


@PROPERTY_SETTINGS
@given(
    model=model_specs(),
    memory_gib=st.floats(4, 100),
    max_model_len=st.integers(16, 8192),
    max_loras=st.sampled_from([0, 1, 4]),
)
def test_plan_accounting_never_exceeds_the_budget(
    make_gpu: Callable[..., InstanceType], model: ModelSpec, memory_gib: float,
    max_model_len: int, max_loras: int,
) -> None:
    p = _plan_or_none(model=model, quantization="awq", instance=make_gpu(int(memory_gib * GIB)),
                      max_model_len=max_model_len, max_loras=max_loras,
                      max_lora_rank=16 if max_loras else 0)
    if p is None:
        return
    used = p.weights_bytes + p.lora_bytes + p.reserve_bytes + p.kv_pool_bytes
    assert used <= p.budget_bytes < used + p.block_bytes
    assert p.budget_bytes + p.headroom_bytes == p.gpu_memory_bytes
    assert p.max_concurrency_at_max_len >= 1
    default_cap = 1024 if p.gpu_memory_bytes >= 70 * GIB else 256  # vLLM's defaults (non-A100)
    assert 1 <= p.max_num_seqs <= default_cap
    assert p.max_num_batched_tokens >= p.max_num_seqs
    assert p.kv_pool_tokens % p.block_size == 0


def test_sweeps_across_the_fit_boundary(
    make_gpu: Callable[..., InstanceType], llama8b: ModelSpec
) -> None:
    """Deterministic sweeps through the refuse/fit boundaries the random shapes rarely hit."""
    settings_ = {"gpu_memory_utilization": 0.9, "max_num_seqs": 64, "max_num_batched_tokens": 2048}
    previous: MemoryPlan | None = None
    outcomes = []
    for quarter_gib in range(40, 100):  # 10 → 25 GiB of GPU memory, bf16 8B weights ≈ 15 GiB
        fitted = _plan_or_none(record=False, model=llama8b, quantization="bf16",
                               max_model_len=8192,
                               instance=make_gpu(quarter_gib * GIB // 4), **settings_)
        outcomes.append(fitted is not None)
        if previous is not None:
            assert fitted is not None
            assert fitted.max_concurrency_at_max_len >= previous.max_concurrency_at_max_len
        previous = fitted or previous
    assert outcomes[0] is False
    assert outcomes[-1] is True
    assert outcomes == sorted(outcomes)  # once it fits, it keeps fitting

    gpu = make_gpu(int(22.5 * GIB))
    concurrency = []
    for max_model_len in range(1024, 131_072 + 1, 1024):
        fitted = _plan_or_none(record=False, model=llama8b, quantization="awq", instance=gpu,
                               max_model_len=min(max_model_len, 8192), **settings_)
        assert fitted is not None
        concurrency.append(fitted.concurrency_at(max_model_len))
    assert concurrency == sorted(concurrency, reverse=True)
    assert concurrency[0] > 1
    assert concurrency[-1] == 0
