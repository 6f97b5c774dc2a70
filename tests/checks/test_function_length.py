"""The length gate (checks/function_length.py): what it measures, where the limit falls, what it
prints and how it exits."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from checks.function_length import MAX_LINES, Length, main, measure_source, offenders


def function(name: str, lines: int, indent: str = "", *, docstring: int = 0) -> str:
    """Source of a function exactly ``lines`` long (def line to last line), ``docstring`` of
    them a docstring."""
    body: list[str] = []
    if docstring:
        more = [f"{indent}    more" for _ in range(docstring - 2)]
        body = [f'{indent}    """Doc.', *more, f'{indent}    """']
    statements = lines - 1 - len(body)
    body += [f"{indent}    x = {i}" for i in range(statements)]
    return "\n".join([f"{indent}def {name}(x):", *body]) + "\n"


def lengths(source: str) -> dict[str, int]:
    return {m.name: m.lines for m in measure_source(source, "pkg/mod.py")}


def test_the_limit_is_80_lines() -> None:
    assert MAX_LINES == 80


def test_an_81_line_function_fails_and_an_80_line_one_passes() -> None:
    measured = measure_source(function("long", 81) + "\n" + function("fits", 80), "pkg/mod.py")
    assert {m.name: m.lines for m in measured} == {"long": 81, "fits": 80}
    assert [str(m) for m in offenders(measured)] == ["pkg/mod.py:1 long 81 lines"]


def test_methods_nested_functions_and_nested_classes_are_measured_by_qualified_name() -> None:
    source = ("def outer(x):\n" + function("inner", 81, "    ") + "    return inner\n\n"
              + "class Shop:\n" + function("method", 5, "    ")
              + "    class Basket:\n" + function("total", 3, "        ")
              + "if True:\n" + function("guarded", 2, "    ")
              + "async def fetch(x):\n    return x\n")
    assert lengths(source) == {"outer": 83, "outer.inner": 81, "Shop.method": 5,
                               "Shop.Basket.total": 3, "guarded": 2, "fetch": 2}
    (inner,) = [m for m in measure_source(source, "pkg/mod.py") if m.name == "outer.inner"]
    assert inner.line == 2


def test_the_docstring_counts_and_decorators_do_not() -> None:
    documented = function("documented", 81, docstring=30)
    assert '"""Doc.' in documented
    assert lengths(documented) == {"documented": 81}
    assert lengths("@property\n@staticmethod\n" + function("decorated", 80)) == {"decorated": 80}


def test_the_cli_prints_offenders_and_exits_1_2_or_0(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    files = {"pkg/long.py": function("long", 81), "pkg/fits.py": function("fits", 80),
             "tests/test_long.py": function("test_long", 200)}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert main([], root=tmp_path) == 1
    out = capsys.readouterr()
    assert out.out.splitlines() == ["pkg/long.py:1 long 81 lines"]
    assert "1 function(s) longer than 80 lines" in out.err
    assert main(["pkg/fits.py"], root=tmp_path) == 0
    assert "none longer than 80 lines" in capsys.readouterr().out
    assert main(["--max", "81"], root=tmp_path) == 0
    capsys.readouterr()

    (tmp_path / "pkg/broken.py").write_text("def broken(:\n", encoding="utf-8")
    assert main([], root=tmp_path) == 2
    assert "pkg/broken.py:1: does not parse" in capsys.readouterr().err


def test_length_prints_as_file_line_name_and_count() -> None:
    assert str(Length("a/b.py", 7, "C.m", 90)) == "a/b.py:7 C.m 90 lines"


def test_the_repository_passes_the_gate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0, capsys.readouterr().out
