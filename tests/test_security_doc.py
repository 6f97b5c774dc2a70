"""docs/security.md lists every acknowledgement the stacks make: one row per checker, rule and
module that calls ``acknowledge`` (cdk-nag), ``acknowledge_guard`` (Control Tower) or
``acknowledge_checkov`` (checkov), read from the code, and no row without such a call."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from stacks.settings import REPO_ROOT

GUIDE = REPO_ROOT / "docs" / "security.md"
CHECKERS = {"acknowledge": "cdk-nag", "acknowledge_guard": "Control Tower",
            "acknowledge_checkov": "checkov"}
ROW = re.compile(r"^\| (?P<checker>[^|]+?) \| (?P<rule>[A-Za-z0-9_.-]+) \| `(?P<where>[^`]+)` \|"
                 r" (?P<reason>[^|]+?) \|$", re.M)


def acknowledgements_in(path: Path, root: Path = REPO_ROOT) -> set[tuple[str, str, str]]:
    """(checker, rule, module relative to ``root``) of each acknowledging call in ``path`` (its
    rule a literal)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in CHECKERS):
            continue
        rule = node.args[1]
        assert isinstance(rule, ast.Constant) and isinstance(rule.value, str), (
            f"{path}:{node.lineno}: the rule is not a literal; the guide cannot list it")
        found.add((CHECKERS[node.func.id], rule.value, str(path.relative_to(root))))
    return found


def test_the_guide_lists_every_acknowledgement_and_nothing_else() -> None:
    in_code = set().union(*(acknowledgements_in(path)
                            for path in sorted((REPO_ROOT / "stacks").rglob("*.py"))))
    rows = list(ROW.finditer(GUIDE.read_text(encoding="utf-8")))
    in_guide = {(row["checker"], row["rule"], row["where"]) for row in rows}
    assert len(in_code) > 20, "not vacuous"
    assert len(rows) == len(in_guide), "a row appears twice"
    assert sorted(in_code - in_guide) == [], "acknowledgements docs/security.md does not list"
    assert sorted(in_guide - in_code) == [], "rows of docs/security.md with no acknowledgement"
    assert all(len(row["reason"]) > 20 for row in rows), "each row says why"


def test_a_module_with_an_acknowledgement_is_found(tmp_path: Path) -> None:
    module = tmp_path / "stacks" / "probe.py"
    module.parent.mkdir()
    module.write_text('acknowledge_checkov(fn, "CKV_AWS_1", "why")\n'
                      'acknowledge(role, "AwsSolutions-IAM5", "why", applies_to=["x"])\n'
                      'print(acknowledge)\n', encoding="utf-8")
    assert acknowledgements_in(module, tmp_path) == {("checkov", "CKV_AWS_1", "stacks/probe.py"),
                                                     ("cdk-nag", "AwsSolutions-IAM5",
                                                      "stacks/probe.py")}
