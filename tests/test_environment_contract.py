"""One contract for the LLM container's environment: product code names no ``GATEWAY_*`` variable,
context split or bucket set of its own.

``serving_contract/environment.py`` holds every ``GATEWAY_*`` name, default and the default
context split; ``request_buckets`` defines the buckets. Everything else that ships (stacks,
containers, Lambdas and the pure packages they import; not tests/, benchmarks/, tools/,
checks/) imports them. The check reads the syntax tree, so prose in docstrings and error
messages that mention a variable is fine; a string that *is* a name, a dict keyed by bucket
names or a tuple of them is not.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path
from typing import get_args

from gpu_budget.engine_args import ENGINE_ARGS
from request_buckets import BUCKET_NAMES, BucketName
from serving_contract.environment import (
    DEFAULT_CONTEXT_SPLIT,
    ENGINE_ENV_PREFIX,
    GATEWAY_SETTINGS,
    format_context_split,
)

REPO = Path(__file__).resolve().parent.parent
NOT_PRODUCT = ("tests/", "benchmarks/", "tools/", "checks/", "docs/")
CONTRACT_MODULES = ("serving_contract/environment.py", "request_buckets/__init__.py")
ENGINE_NAMES = frozenset({ENGINE_ENV_PREFIX, *(arg.env for arg in ENGINE_ARGS)})
"""The engine arguments' variables (``ENGINE_MAX_MODEL_LEN`` ...) and their prefix: typed, they
would bypass the GPU budget's table (``gpu_budget.engine_args``)."""
SPLIT_SHARES = (DEFAULT_CONTEXT_SPLIT.system, DEFAULT_CONTEXT_SPLIT.rag,
                DEFAULT_CONTEXT_SPLIT.history, DEFAULT_CONTEXT_SPLIT.output)


def product_modules() -> list[str]:
    """Tracked and new Python files that ship or feed what ships, outside the contract."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=REPO, check=True, capture_output=True, text=True).stdout.split()
    return sorted(path for path in listed
                  if not path.startswith(NOT_PRODUCT) and path not in CONTRACT_MODULES
                  and (REPO / path).is_file())


def _strings(node: ast.AST) -> list[str] | None:
    """The string constants of a tuple/list/set/dict-keys node, None if any element is not one."""
    if isinstance(node, ast.Dict):
        elements: list[ast.expr | None] = list(node.keys)
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        elements = list(node.elts)
    else:
        return None
    values = [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return values if len(values) == len(elements) else None


def _numbers(node: ast.AST) -> tuple[float, ...]:
    """The numeric arguments of a call, in order."""
    if not isinstance(node, ast.Call):
        return ()
    args = [*node.args, *(keyword.value for keyword in node.keywords)]
    return tuple(a.value for a in args if isinstance(a, ast.Constant)
                 and isinstance(a.value, int | float) and not isinstance(a.value, bool))


def contract_violations(path: str, source: str) -> list[str]:
    """``path:line: what`` for each GATEWAY_ name, bucket set or context split typed in ``source``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename=path)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and (node.value in ENGINE_NAMES or (node.value.startswith("GATEWAY_")
                     and node.value.rstrip("_").replace("_", "").isalnum()
                     and node.value.upper() == node.value)):
            found.append(f"{path}:{line}: the name {node.value!r} (import it from "
                         "serving_contract.environment, or an engine argument's "
                         "gpu_budget.engine_args.ENGINE_ARG[...].env)")
        strings = _strings(node)
        if strings and len(set(strings) & set(BUCKET_NAMES)) >= 2:
            found.append(f"{path}:{line}: bucket names {strings} (use request_buckets)")
        if _numbers(node) == SPLIT_SHARES:
            found.append(f"{path}:{line}: the context split {SPLIT_SHARES} (use "
                         "serving_contract.environment.DEFAULT_CONTEXT_SPLIT)")
    return found


def test_product_code_types_no_environment_name_bucket_set_or_split() -> None:
    problems = [problem for path in product_modules()
                for problem in contract_violations(path, (REPO / path).read_text())]
    assert not problems, "\n".join(problems)


def test_the_check_finds_what_it_looks_for() -> None:
    source = ('env = {"GATEWAY_MODEL_DIR": "/m"}\ncaps = {"S": 1, "M": 2}\n'
              'mix: Literal["S", "M", "L", "XL"]\nsplit = Split(0.125, 0.25, 0.5, 0.125)\n'
              'raise EngineConfigError("...", setting="ENGINE_BLOCK_SIZE")\n'
              'message = f"GATEWAY_MODEL_DIR={path}: missing"\n'
              '"""GATEWAY_MODEL_DIR in a docstring is prose."""\n')
    found = contract_violations("x.py", source)
    assert sorted(problem.split(":")[1] for problem in found) == ["1", "2", "3", "4", "5"]


def test_bucket_name_type_matches_the_buckets() -> None:
    assert get_args(BucketName) == BUCKET_NAMES


def test_every_gateway_name_once_and_the_split_default() -> None:
    names = [spec.env for spec in GATEWAY_SETTINGS]
    assert len(names) == len(set(names))
    assert all(name.startswith("GATEWAY_") for name in names)
    assert format_context_split(DEFAULT_CONTEXT_SPLIT) == \
        "system=0.125,rag=0.25,history=0.5,output=0.125"
