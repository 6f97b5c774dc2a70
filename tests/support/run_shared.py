"""What the xdist workers of one pytest run share: a directory and an exclusive lock, so a costly
session fixture (the synthesized app, a downloaded wheel) is made once per run, not per worker."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def shared_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory every xdist worker of this run shares (the parent of the workers' base
    temporary directories; without xdist, this process's own)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_file``; another worker asking for it waits."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
