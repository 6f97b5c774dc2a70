"""The vLLM adapter against vLLM 0.33.0's own source, read from the pinned wheel (no import).

vLLM cannot be imported here (CUDA 13 build, no GPU), so this test downloads the exact wheel the
image installs (``pip download vllm==0.33.0 --no-deps``, cached under ``.cache/wheels``), reads
the modules it needs out of the zip and checks with ``ast`` that every engine argument the stack
and the adapter set exists on ``EngineArgs``, that none of the removed ones is used, and that
the ``AsyncLLM`` members, ``generate`` keywords and helper classes the adapter calls exist. A
renamed or removed argument fails here before it can fail on a GPU.
"""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest

from gateway.engines import vllm as adapter
from gpu_budget import engine_args_from_env
from stacks.llm_endpoint import container_environment
from stacks.settings import load_settings

VLLM_VERSION = "0.33.0"
REMOVED_ENGINE_ARGS = ("swap_space", "scheduler_delay_factor", "preemption_mode")


@pytest.fixture(scope="module")
def vllm_source(vllm_wheel: Path) -> dict[str, ast.Module]:
    """The vLLM modules the adapter depends on, parsed from the pinned wheel."""
    wanted = {
        "arg_utils": "vllm/engine/arg_utils.py",
        "async_llm": "vllm/v1/engine/async_llm.py",
        "sampling_params": "vllm/sampling_params.py",
        "lora_request": "vllm/lora/request.py",
        "inputs_llm": "vllm/inputs/llm.py",
        "inputs_init": "vllm/inputs/__init__.py",
        "vllm_init": "vllm/__init__.py",
        "exceptions": "vllm/exceptions.py",
        "engine_exceptions": "vllm/v1/engine/exceptions.py",
        "loggers": "vllm/v1/metrics/loggers.py",
        "stats": "vllm/v1/metrics/stats.py",
        "cache_config": "vllm/config/cache.py",
    }
    with zipfile.ZipFile(vllm_wheel) as wheel:
        return {key: ast.parse(wheel.read(path).decode()) for key, path in wanted.items()}


def class_def(module: ast.Module, name: str) -> ast.ClassDef:
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"class {name} not found")


def class_fields(node: ast.ClassDef) -> set[str]:
    """Annotated class-level names (dataclass / msgspec / TypedDict fields)."""
    return {stmt.target.id for stmt in node.body
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)}


def class_members(node: ast.ClassDef) -> set[str]:
    """Methods, properties and ``self.x = ...`` attributes set anywhere in the class."""
    members = {stmt.name for stmt in node.body
               if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef)}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) and isinstance(
                sub.value, ast.Name) and sub.value.id == "self":
            members.add(sub.attr)
    return members


def method(node: ast.ClassDef, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    for stmt in node.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name == name:
            return stmt
    raise AssertionError(f"{node.name}.{name} not found")


def exported_names(module: ast.Module) -> set[str]:
    """Names a package ``__init__`` exposes (imports, lazy-import tables and __all__)."""
    names: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    return names


def engine_arg_names(vllm_source: dict[str, ast.Module]) -> set[str]:
    """Fields of AsyncEngineArgs: EngineArgs' plus the async front-end's own."""
    module = vllm_source["arg_utils"]
    return class_fields(class_def(module, "EngineArgs")) | class_fields(
        class_def(module, "AsyncEngineArgs"))


def check_engine_args(names: set[str], vllm_source: dict[str, ast.Module]) -> None:
    """Raise AssertionError naming every argument EngineArgs does not have, or a removed one."""
    known = engine_arg_names(vllm_source)
    unknown = sorted(names - known)
    removed = sorted(names & set(REMOVED_ENGINE_ARGS))
    assert not unknown, f"not EngineArgs fields in vLLM {VLLM_VERSION}: {unknown}"
    assert not removed, f"removed from vLLM: {removed}"


def test_the_wheel_really_has_engine_args(vllm_source: dict[str, ast.Module]) -> None:
    names = engine_arg_names(vllm_source)
    assert {"max_model_len", "gpu_memory_utilization", "max_loras"} <= names
    assert not set(REMOVED_ENGINE_ARGS) & names, "FACTS.md: these were removed in 0.33"


def test_every_argument_the_adapter_sets_exists(vllm_source: dict[str, ast.Module]) -> None:
    check_engine_args(set(adapter.ENGINE_ARG_FIELDS), vllm_source)


@pytest.mark.parametrize("environment", ["dev", "prod"])
def test_every_argument_the_stack_sets_exists(
    vllm_source: dict[str, ast.Module], environment: str
) -> None:
    settings = load_settings(environment)
    env = container_environment(settings.llm, settings.llm.memory_plan(),
                                endpoint_name="e", variant_name="v")
    check_engine_args(set(engine_args_from_env(env)), vllm_source)


@pytest.mark.parametrize("misspelled", ["max_num_seq", "swap_space", "gpu_memory_utilisation"])
def test_a_misspelled_or_removed_argument_fails(
    vllm_source: dict[str, ast.Module], misspelled: str
) -> None:
    with pytest.raises(AssertionError, match=misspelled):
        check_engine_args({"max_model_len", misspelled}, vllm_source)


def test_the_adapter_only_calls_declared_engine_members() -> None:
    """Every ``engine.x`` / ``self._engine.x`` the adapter touches is in ASYNC_LLM_MEMBERS, and
    every keyword it passes to ``generate`` is in GENERATE_KEYWORDS, so the next two tests
    cover all of them."""
    tree = ast.parse(Path(adapter.__file__).read_text())
    touched: set[str] = set()
    generate_keywords: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if (isinstance(base, ast.Name) and base.id in ("async_llm", "AsyncLLM")) or (
                isinstance(base, ast.Attribute) and base.attr in ("_engine", "AsyncLLM")
            ):
                touched.add(node.attr)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr == "generate"):
            generate_keywords.update(k.arg for k in node.keywords if k.arg)
    assert touched, "the adapter must reach the engine somewhere"
    assert touched <= set(adapter.ASYNC_LLM_MEMBERS), touched - set(adapter.ASYNC_LLM_MEMBERS)
    assert generate_keywords == set(adapter.GENERATE_KEYWORDS)


def test_async_llm_has_every_member_the_adapter_uses(vllm_source: dict[str, ast.Module]) -> None:
    members = class_members(class_def(vllm_source["async_llm"], "AsyncLLM"))
    missing = sorted(set(adapter.ASYNC_LLM_MEMBERS) - members)
    assert not missing, f"AsyncLLM in vLLM {VLLM_VERSION} has no {missing}"


def test_generate_and_from_engine_args_take_our_arguments(
    vllm_source: dict[str, ast.Module],
) -> None:
    async_llm = class_def(vllm_source["async_llm"], "AsyncLLM")
    generate = method(async_llm, "generate")
    positional = [a.arg for a in generate.args.args]
    assert positional[:4] == ["self", "prompt", "sampling_params", "request_id"]
    keywords = {a.arg for a in generate.args.kwonlyargs}
    assert set(adapter.GENERATE_KEYWORDS) <= keywords
    from_args = method(async_llm, "from_engine_args")
    assert "stat_loggers" in {a.arg for a in (*from_args.args.args, *from_args.args.kwonlyargs)}


def test_helper_classes_have_the_fields_we_pass(vllm_source: dict[str, ast.Module]) -> None:
    sampling = class_fields(class_def(vllm_source["sampling_params"], "SamplingParams"))
    assert {"max_tokens", "temperature", "top_p", "stop", "seed", "presence_penalty",
            "frequency_penalty", "output_kind"} <= sampling
    kind = class_def(vllm_source["sampling_params"], "RequestOutputKind")
    assert "DELTA" in {t.id for s in kind.body if isinstance(s, ast.Assign)
                       for t in s.targets if isinstance(t, ast.Name)}
    lora = class_fields(class_def(vllm_source["lora_request"], "LoRARequest"))
    assert {"lora_name", "lora_int_id", "lora_path"} <= lora
    assert "prompt_token_ids" in class_fields(class_def(vllm_source["inputs_llm"], "TokensPrompt"))
    assert "TokensPrompt" in exported_names(vllm_source["inputs_init"])
    assert {"AsyncEngineArgs", "SamplingParams"} <= exported_names(vllm_source["vllm_init"])
    class_def(vllm_source["exceptions"], "VLLMValidationError")
    class_def(vllm_source["engine_exceptions"], "EngineDeadError")
    cache = class_fields(class_def(vllm_source["cache_config"], "CacheConfig"))
    assert {"num_gpu_blocks", "block_size"} <= cache


def test_the_stat_logger_matches_vllms_interface(vllm_source: dict[str, ast.Module]) -> None:
    base = class_def(vllm_source["loggers"], "StatLoggerBase")
    abstract = {m.name for m in base.body if isinstance(m, ast.FunctionDef) and any(
        isinstance(d, ast.Name) and d.id == "abstractmethod" for d in m.decorator_list)}
    assert abstract == {"__init__", "record", "log_engine_initialized"}
    record_args = [a.arg for a in method(base, "record").args.args]
    assert record_args == ["self", "scheduler_stats", "iteration_stats", "mm_cache_stats",
                           "engine_idx"]
    scheduler = class_fields(class_def(vllm_source["stats"], "SchedulerStats"))
    assert {"kv_cache_usage", "num_running_reqs", "num_waiting_reqs"} <= scheduler
    iteration = class_members(class_def(vllm_source["stats"], "IterationStats"))
    assert "num_preempted_reqs" in iteration
