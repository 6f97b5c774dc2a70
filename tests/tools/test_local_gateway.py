"""make local's gateway listens on 127.0.0.1 unless told otherwise (HOST=, --host)."""

from __future__ import annotations

import re
from pathlib import Path

from tools.local_gateway import DEFAULT_HOST, parse_args, serve_command

REPO = Path(__file__).resolve().parents[2]


def test_it_listens_on_loopback_by_default() -> None:
    args = parse_args([])
    assert args.host == DEFAULT_HOST == "127.0.0.1"
    command = serve_command(args.host, args.port)
    assert command[command.index("--host") + 1] == "127.0.0.1"


def test_host_changes_it() -> None:
    args = parse_args(["--host", "0.0.0.0", "--port", "9000"])
    command = serve_command(args.host, args.port)
    assert command[-4:] == ["--host", "0.0.0.0", "--port", "9000"]


def test_make_local_passes_host() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^local:.*\n\t(.*)$", makefile, re.M)
    assert recipe is not None
    assert "$(if $(HOST),--host $(HOST))" in recipe.group(1)
