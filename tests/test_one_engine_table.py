"""One table of engine arguments (gpu_budget/engine_args.py), read by every side that touches them.

The GPU budget writes its plan from the table, the container parses its ``ENGINE_*`` variables
with it, the vLLM adapter maps the parsed settings row by row, and the stack's settings take
their bounds from it. These tests prove that: a plan goes through the environment, the
container's settings and the adapter unchanged, the gateway's defaults are the table's (its
utilization the A10G's SKU rule, not a number of its own), and no module keeps its own set of
block sizes or LoRA ranks, or its own utilization cap (checked on the sources with ``ast``).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gateway.engines.vllm import ENGINE_ARG_FIELDS, GATEWAY_SUPPLIED_FIELDS, engine_arguments
from gateway.settings import SETTING_SPECS, EngineSettings, SettingsError
from gateway.settings import load_settings as load_gateway_settings
from gpu_budget import MemoryPlan, gpu_memory_utilization_for, instance_type, plan
from gpu_budget.engine_args import (
    BLOCK_SIZE_MULTIPLE,
    BLOCK_SIZES,
    ENGINE_ARG,
    ENGINE_ARGS,
    MAX_LORA_RANKS,
    block_sizes_for,
)
from gpu_budget.instances import MAX_GPU_MEMORY_UTILIZATION
from stacks.llm_endpoint import container_environment
from stacks.settings import EngineOverrides, LlmEndpointSettings
from stacks.settings import load_settings as load_stack_settings

REPO_ROOT = Path(__file__).resolve().parents[1]
LLAMA_8B = str(REPO_ROOT / "config" / "models" / "llama-3-8b-instruct.json")

GUARDED_SOURCES: tuple[str, ...] = (
    *sorted(str(path.relative_to(REPO_ROOT)) for path in (REPO_ROOT / "gpu_budget").glob("*.py")
            if path.name not in ("engine_args.py", "instances.py")),
    "containers/llm/gateway/settings.py",
    "containers/llm/gateway/engines/vllm.py",
    "stacks/settings/llm.py",
    "stacks/llm_endpoint.py",
)
"""Every module that reads engine arguments. ``engine_args.py`` is the table; ``instances.py``
holds the SKU rule whose cap the table's utilization row reads."""

ENGINE_SIZE_UNIVERSE = frozenset({1, 8, 16, 32, 64, 128, 256, 320, 512})
"""Numbers a hand-typed set of block sizes or LoRA ranks is made of; such a set holds 16 or 32
(AWQ's group sizes, 64 and 128, are not one)."""


def own_engine_bounds(source: str) -> list[str]:
    """Literal sets of block sizes / LoRA ranks, block-size multiples per device, and the 0.95
    utilization cap typed in ``source`` (each as ``line: what``)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        elements: list[ast.expr] | None = None
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            elements = list(node.elts)
        elif isinstance(node, ast.Dict):
            elements = list(node.values)
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
                node.value.id == "Literal":
            inner = node.slice
            elements = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
        if elements is not None and len(elements) >= 2 and all(
                isinstance(e, ast.Constant) and type(e.value) is int for e in elements):
            values = {e.value for e in elements}  # type: ignore[attr-defined]
            if values <= ENGINE_SIZE_UNIVERSE and values & {16, 32}:
                found.append(f"{node.lineno}: its own set {sorted(values)}")
        if isinstance(node, ast.Constant) and node.value in (0.95, "0.95"):
            found.append(f"{node.lineno}: its own utilization cap {node.value!r}")
    return found


@pytest.mark.parametrize("path", GUARDED_SOURCES)
def test_no_module_keeps_its_own_engine_bounds(path: str) -> None:
    found = own_engine_bounds((REPO_ROOT / path).read_text(encoding="utf-8"))
    assert not found, f"{path} types engine bounds the table owns: {found}"


@pytest.mark.parametrize("snippet", [
    "ALLOWED_BLOCK_SIZES = (8, 16, 32, 64, 128)",
    "VLLM_LORA_RANKS = [1, 8, 16, 32, 64, 128, 256, 320, 512]",
    "block_size: Literal[16, 32] = 16",
    'BLOCK_SIZE_MULTIPLE = {"cuda": 16, "cpu": 32}',
    "x: float | None = Field(None, gt=0, le=0.95)",
    'SettingSpec("ENGINE_GPU_MEMORY_UTILIZATION", "0.95", "help")',
])
def test_the_guard_finds_a_hand_typed_bound(snippet: str) -> None:
    assert own_engine_bounds(snippet)


def test_the_guard_leaves_other_numbers_alone() -> None:
    assert not own_engine_bounds("caps = {'S': 128, 'M': 64, 'XL': 8, 'L': 3}\nsizes = (1, 2, 4)")


def test_the_table_rows_are_consistent() -> None:
    assert all(size % BLOCK_SIZE_MULTIPLE["cuda"] == 0 for size in BLOCK_SIZES)
    assert 8 not in BLOCK_SIZES  # not a size vLLM's CUDA attention backend takes
    assert block_sizes_for("cpu") == (32, 64, 128)
    assert block_sizes_for("cuda") == BLOCK_SIZES
    assert ENGINE_ARG["block_size"].choices == BLOCK_SIZES
    assert ENGINE_ARG["max_lora_rank"].choices == MAX_LORA_RANKS
    assert ENGINE_ARG["gpu_memory_utilization"].maximum == MAX_GPU_MEMORY_UTILIZATION
    for arg in ENGINE_ARGS:
        assert arg.parse(arg.default_text) == arg.default, arg.name
        assert arg.why, f"{arg.name} says why"
    assert len({arg.env for arg in ENGINE_ARGS}) == len({arg.field for arg in ENGINE_ARGS}) \
        == len(ENGINE_ARGS)


def test_the_gateway_default_utilization_is_the_a10g_rule() -> None:
    a10g = instance_type("ml.g5.xlarge")
    rule = gpu_memory_utilization_for(a10g.memory_per_accelerator_bytes)
    assert load_gateway_settings({}).engine.gpu_memory_utilization == rule == 0.84
    sized = plan(LLAMA_8B, quantization="awq", instance="ml.g5.xlarge", max_model_len=4096)
    assert sized.gpu_memory_utilization == rule


def test_the_container_and_the_adapter_are_built_from_the_table() -> None:
    engine_fields = {f.name for f in dataclasses.fields(EngineSettings)}
    assert engine_fields == {arg.name for arg in ENGINE_ARGS}
    specs = {spec.env: spec.default for spec in SETTING_SPECS
             if spec.env.startswith("ENGINE_")}
    assert specs == {arg.env: arg.default_text for arg in ENGINE_ARGS}
    assert set(ENGINE_ARG_FIELDS) == {arg.field for arg in ENGINE_ARGS} | set(
        GATEWAY_SUPPLIED_FIELDS)


def adapter_kwargs(env: dict[str, str], adapters: str) -> dict[str, Any]:
    """What the vLLM adapter would pass to ``AsyncEngineArgs`` for ``env``."""
    return engine_arguments(load_gateway_settings({**env, "GATEWAY_ADAPTERS": adapters,
                                                   "GATEWAY_ROUTING_TABLE": "",
                                                   "GATEWAY_LOCALE_ROUTES": ""}))


def assert_same_engine_args(sized: MemoryPlan, kwargs: dict[str, Any]) -> None:
    planned = {name: value for name, value in sized.engine_args().items() if value is not None}
    assert {name: kwargs.get(name) for name in planned} == planned
    unplanned_lora = {"max_loras", "max_lora_rank", "max_cpu_loras"} - set(planned)
    assert not unplanned_lora & set(kwargs), "LoRA arguments only when the plan turns LoRA on"


@pytest.mark.parametrize("environment", ["dev", "prod"])
def test_the_stacks_plan_reaches_vllm_unchanged(environment: str) -> None:
    """plan → container environment (the stack) → container settings → adapter kwargs."""
    llm = load_stack_settings(environment).llm
    capacity = llm.capacity_plan()
    sized = capacity.memory_plan
    env = container_environment(llm, capacity, endpoint_name="e", variant_name="v")
    kwargs = engine_arguments(load_gateway_settings(env))
    assert_same_engine_args(sized, kwargs)
    assert (kwargs["enable_prefix_caching"], kwargs["enforce_eager"]) == (
        llm.engine.enable_prefix_caching, llm.engine.enforce_eager)
    assert kwargs.get("max_num_queued_reqs") == llm.engine.max_num_queued_reqs


@pytest.mark.parametrize("overrides", [
    {},
    {"block_size": 32, "kv_cache_dtype": "fp8"},
    {"block_size": 128, "gpu_memory_utilization": 0.9, "max_num_seqs": 64,
     "max_num_batched_tokens": 4096},
    {"max_loras": 3, "max_lora_rank": 64, "max_cpu_loras": 6},
    {"quantization": "bf16", "instance": "ml.g6e.xlarge"},
    {"quantization": "awq", "instance": "ml.g4dn.xlarge"},
    {"instance": "ml.g5.12xlarge", "tensor_parallel_size": 4, "max_loras": 1,
     "max_lora_rank": 8},
])
def test_any_plan_round_trips_to_the_adapter(overrides: dict[str, Any]) -> None:
    kwargs: dict[str, Any] = {"quantization": "awq", "instance": "ml.g5.xlarge",
                              "max_model_len": 4096, **overrides}
    sized = plan(LLAMA_8B, **kwargs)
    adapters = "manga=manga_domain" if sized.max_loras else ""
    assert_same_engine_args(sized, adapter_kwargs(sized.engine_env(), adapters))


def test_a_block_size_outside_the_table_is_refused_everywhere() -> None:
    with pytest.raises(SettingsError, match=r"ENGINE_BLOCK_SIZE=8: one of 16, 32, 64, 128"):
        load_gateway_settings({"ENGINE_BLOCK_SIZE": "8"})
    with pytest.raises(ValueError, match="block_size 8 is not one vLLM's CUDA attention"):
        plan(LLAMA_8B, quantization="awq", instance="ml.g5.xlarge", max_model_len=4096,
             block_size=8)
    llm = load_stack_settings("dev").llm.model_dump()
    with pytest.raises(ValueError, match="must be one of 16, 32, 64, 128"):
        LlmEndpointSettings.model_validate({**llm, "block_size": 8})
    assert LlmEndpointSettings.model_validate({**llm, "block_size": 64}).block_size == 64


def test_the_stacks_utilization_bound_is_the_tables() -> None:
    assert EngineOverrides(gpu_memory_utilization=MAX_GPU_MEMORY_UTILIZATION)
    with pytest.raises(ValueError, match=f"less than or equal to {MAX_GPU_MEMORY_UTILIZATION}"):
        EngineOverrides(gpu_memory_utilization=MAX_GPU_MEMORY_UTILIZATION + 0.01)
    with pytest.raises(SettingsError, match=r"\(0, 0.95\]"):
        load_gateway_settings({"ENGINE_GPU_MEMORY_UTILIZATION": "0.96"})


def test_the_docs_show_the_table() -> None:
    from gpu_budget.engine_args import engine_table_markdown

    docs = (REPO_ROOT / "docs" / "gpu-budget.md").read_text(encoding="utf-8")
    assert engine_table_markdown() in docs, "regenerate it with engine_table_markdown()"


def test_random_weights_are_for_measurement_only() -> None:
    """ENGINE_LOAD_FORMAT=dummy serves random weights (tools/gpu_smoke.sh on a host without the
    weights); the container accepts it, a deployed stage's plan refuses it."""
    assert load_gateway_settings({"ENGINE_LOAD_FORMAT": "dummy"}).engine.load_format == "dummy"
    sized = plan(LLAMA_8B, quantization="awq", instance="ml.g5.xlarge", max_model_len=4096)
    with pytest.raises(ValueError, match="ENGINE_LOAD_FORMAT='dummy': only a measurement"):
        sized.engine_env({"load_format": "dummy"})
