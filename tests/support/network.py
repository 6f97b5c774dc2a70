"""Local network helpers for tests that start servers as processes: a free port, and waiting
until a server answers."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _never_exits() -> str | None:
    return None


def wait_until_ok(url: str, *, timeout_s: float, interval_s: float = 0.1, name: str = "server",
                  exited: Callable[[], str | None] = _never_exits) -> httpx.Response:
    """GET ``url`` until it answers 200 and return that answer. AssertionError as soon as
    ``exited`` says why the server is gone, or after ``timeout_s`` naming the last answer (its
    JSON body) or connection error."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        reason = exited()
        if reason is not None:
            raise AssertionError(reason)
        try:
            response = httpx.get(url, timeout=2.0)
            last = response.json()
            if response.status_code == 200:
                return response
        except httpx.TransportError as error:
            last = error
        time.sleep(interval_s)
    path = httpx.URL(url).path
    raise AssertionError(f"{name} not ready after {timeout_s} s; last {path}: {last!r}")
