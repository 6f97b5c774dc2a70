"""One home per rule (issue 41): a rule the budget, the gateway, the capacity model and the stacks
all apply is written once and imported; these checks keep a second copy from coming back.

* KV blocks for a token count: :func:`gpu_budget.lengths.blocks_for_tokens` (the ceiling
  division ``-(-tokens // block_size)`` nowhere else in product code).
* The context split's rules: :func:`serving_contract.environment.context_split_problems`, which
  the gateway's settings, the stack settings and the capacity model's window all call — checked
  here by giving the three the same bad split.
* The default block size: ``DEFAULT_BLOCK_SIZE`` (:mod:`gpu_budget.kv`); no ``block_size``
  parameter defaults to a literal.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from capacity_model.demand import ContextWindow, DemandError
from gateway.settings import SettingsError
from gateway.settings import load_settings as gateway_settings
from serving_contract.environment import ContextSplit, context_split_problems
from stacks.settings.llm import ContextWindowSettings
from tests.test_readme_layout import REPO_ROOT, product_paths, python_files

CEILING_DIVISION = re.compile(r"-\s*\(\s*-\s*[\w.]+\s*//\s*[\w.]*block")
"""``-(-tokens // block_size)``: whole KV blocks for a token count."""


def product_files() -> list[Path]:
    files = [file for root in product_paths() for file in python_files(root)]
    assert len(files) > 100, "not vacuous"
    return files


def test_kv_blocks_for_tokens_are_counted_in_one_place() -> None:
    home = REPO_ROOT / "gpu_budget" / "lengths.py"
    copies = sorted(str(file.relative_to(REPO_ROOT)) for file in product_files()
                    if file != home and CEILING_DIVISION.search(file.read_text(encoding="utf-8")))
    assert copies == [], f"count KV blocks with gpu_budget.lengths.blocks_for_tokens: {copies}"
    assert CEILING_DIVISION.search(home.read_text(encoding="utf-8")), "the home moved: update"


def test_no_block_size_parameter_defaults_to_a_literal() -> None:
    found = []
    for file in product_files():
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            arguments = node.args
            positional = [*arguments.posonlyargs, *arguments.args]
            pairs = [*zip(positional[len(positional) - len(arguments.defaults):],
                          arguments.defaults, strict=True),
                     *((arg, default) for arg, default in zip(arguments.kwonlyargs,
                                                              arguments.kw_defaults, strict=True)
                       if default is not None)]
            found += [f"{file.relative_to(REPO_ROOT)}:{node.lineno} {node.name}"
                      for arg, default in pairs
                      if arg.arg == "block_size" and isinstance(default, ast.Constant)]
    assert found == [], f"default block_size to gpu_budget.kv.DEFAULT_BLOCK_SIZE: {found}"


def test_the_context_split_rule_is_defined_once() -> None:
    definitions = [str(file.relative_to(REPO_ROOT)) for file in product_files()
                   if "must be above 0\"" in file.read_text(encoding="utf-8")
                   and "history and output" in file.read_text(encoding="utf-8")]
    assert definitions == ["serving_contract/environment.py"], definitions


@pytest.mark.parametrize("shares", [
    (0.5, 0.5, 0.5, 0.1),   # adds up to 1.6
    (0.1, 0.1, 0.0, 0.1),   # no history
    (0.1, 0.1, 0.5, 0.0),   # no output
])
def test_the_gateway_the_stack_and_the_capacity_model_refuse_the_same_splits(
        shares: tuple[float, float, float, float]) -> None:
    split = ContextSplit(*shares)
    problems = context_split_problems(split)
    assert problems, "a bad split"
    text = ",".join(f"{name}={share:g}" for name, share
                    in zip(("system", "rag", "history", "output"), shares, strict=True))
    with pytest.raises(SettingsError) as gateway:
        gateway_settings({"GATEWAY_CONTEXT_SPLIT": text, "GATEWAY_ENGINE": "sim"})
    with pytest.raises(ValidationError) as stack:
        ContextWindowSettings(system=shares[0], rag=shares[1], history=shares[2],
                              output=shares[3])
    with pytest.raises(DemandError) as window:
        ContextWindow(*shares)
    for refusal in (gateway, stack, window):
        assert all(problem in str(refusal.value) for problem in problems), str(refusal.value)
