"""The complexity gate (checks/complexity.py, in `make lint`): what it measures, how the
allow-list tolerates today's offenders and nothing more, and that the repository passes it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from checks.complexity import (
    AllowlistError,
    Measured,
    judge,
    main,
    measure_source,
    python_files,
    read_allowlist,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def branches(name: str, count: int, indent: str = "") -> str:
    """A function of complexity ``count + 1`` (one ``if`` per branch)."""
    body = "".join(f"{indent}    if x == {i}:\n{indent}        return {i}\n" for i in range(count))
    return f"{indent}def {name}(x):\n{body}{indent}    return -1\n"


def test_every_kind_of_function_is_measured_with_its_qualified_name() -> None:
    source = (branches("plain", 3) + "\n"
              + "def outer(x):\n" + branches("inner", 21, "    ") + "    return inner\n\n"
              + "class Shop:\n" + branches("method", 2, "    ")
              + "    class Basket:\n" + branches("total", 1, "        "))
    measured = {m.name: m for m in measure_source(source, "pkg/mod.py")}
    assert {name: m.complexity for name, m in measured.items()} == {
        "plain": 4, "outer": 1, "outer.inner": 22, "Shop.method": 3, "Shop.Basket.total": 2}
    assert measured["outer.inner"].line == 11
    assert measured["plain"].path == "pkg/mod.py"


def test_allowlist_lines_and_their_errors() -> None:
    text = ("# why the list exists\n\n"
            "a/b.py::f 25   # owner\n"
            "a/b.py::C.m 21\n")
    allowed = read_allowlist(text, source="list.txt")
    assert {key: a.complexity for key, a in allowed.items()} == {
        ("a/b.py", "f"): 25, ("a/b.py", "C.m"): 21}
    assert allowed[("a/b.py", "C.m")].line == 4
    for bad, message in [
        ("a/b.py f 25", r"list.txt:1: 'a/b.py f 25'; accepted: 'path::qualified.name complexity'"),
        ("a/b.py::f many", "accepted: 'path::qualified.name complexity'"),
        ("a/b.py::f 20", "list.txt:1: a/b.py::f at 20 is within the limit 20 already"),
        ("a/b.py::f 25\na/b.py::f 30", r"list.txt:2: a/b.py::f is listed twice \(first on line 1\)"),
    ]:
        with pytest.raises(AllowlistError, match=message):
            read_allowlist(bad, source="list.txt")


def measured(complexity: int, name: str = "f", path: str = "a/b.py") -> Measured:
    return Measured(path=path, line=7, name=name, complexity=complexity)


def test_a_function_over_the_limit_fails_naming_file_line_and_complexity() -> None:
    verdict = judge([measured(21), measured(20, "g")], {})
    assert not verdict.passed
    assert verdict.offenders == ["a/b.py:7 f 21 (limit 20)"]


def test_the_allowlist_tolerates_a_listed_function_only_up_to_its_complexity() -> None:
    allowed = read_allowlist("a/b.py::f 25\n", source="list.txt")
    assert judge([measured(25)], allowed).passed
    assert judge([measured(23)], allowed).passed  # better, still over: fine
    worse = judge([measured(26)], allowed)
    assert worse.offenders == ["a/b.py:7 f 26 (allow-listed at 25: it got more complex; split "
                               "it instead)"]
    other = judge([measured(25), measured(21, "g")], allowed)
    assert other.offenders == ["a/b.py:7 g 21 (limit 20)"]


def test_a_listed_function_that_was_split_or_removed_makes_its_line_stale() -> None:
    allowed = read_allowlist("a/b.py::f 25\n", source="list.txt")
    split = judge([measured(12)], allowed, allowlist_name="list.txt")
    assert split.stale == ["list.txt:1 a/b.py::f is now 12, within the limit 20: delete the line"]
    gone = judge([], allowed, allowlist_name="list.txt")
    assert gone.stale == ["list.txt:1 a/b.py::f no longer exists, within the limit 20: delete "
                          "the line"]
    assert not gone.passed
    assert judge([], allowed, scanned=["other.py"]).passed  # a.py was not measured this time


def git_repo(tmp_path: Path, files: dict[str, str]) -> Path:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    (tmp_path / ".gitignore").write_text(".venv\n", encoding="utf-8")
    return tmp_path


def test_the_cli_measures_what_git_knows_outside_tests(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    root = git_repo(tmp_path, {"pkg/dense.py": branches("dense", 22),
                               "pkg/fine.py": branches("fine", 2),
                               "tests/test_dense.py": branches("test_dense", 30),
                               ".venv/lib/site.py": branches("vendored", 30),
                               "node_modules/x/y.py": branches("bundled", 30)})
    assert python_files(root) == ["pkg/dense.py", "pkg/fine.py"]
    assert main(["--allowlist", str(root / "none.txt")], root=root) == 1
    out = capsys.readouterr()
    assert out.out.splitlines() == ["pkg/dense.py:1 dense 23 (limit 20)"]
    assert "1 function(s) above 20" in out.err

    (root / "allow.txt").write_text("pkg/dense.py::dense 23\n", encoding="utf-8")
    assert main(["--allowlist", str(root / "allow.txt")], root=root) == 0
    assert "1 allow-listed" in capsys.readouterr().out
    assert main(["--allowlist", str(root / "allow.txt"), "--max", "25"], root=root) == 2
    assert "within the limit 25 already" in capsys.readouterr().err
    assert main(["--allowlist", str(root / "none.txt"), "pkg/fine.py"], root=root) == 0


def test_the_repository_passes_the_gate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0, capsys.readouterr().out
