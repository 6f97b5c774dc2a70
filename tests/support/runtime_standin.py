"""A local stand-in for the SageMaker runtime's wire protocol, in front of local containers.

    python -m tests.support.runtime_standin --endpoint manga-assist-dev-llm=http://127.0.0.1:8080 \
        --endpoint manga-assist-dev-intent=http://127.0.0.1:8081 [--port 8090]

then ``make smoke ENV=dev SMOKE_FLAGS="--endpoint-url http://127.0.0.1:8090"``. Naming an
endpoint twice gives it two instances. It answers

* ``POST /endpoints/<name>/invocations`` — forwards the body to the container's
  ``/invocations`` and returns its answer as InvokeEndpoint does (a container error becomes
  SageMaker's 424 ``ModelError``);
* ``POST /endpoints/<name>/invocations-response-stream`` — forwards likewise and re-sends the
  container's bytes as ``PayloadPart`` events in AWS's binary event-stream framing
  (``tests/support/eventstream.py``), cut into parts of at most ``max_part_bytes`` at arbitrary byte
  boundaries, as SageMaker does; a container stream that breaks becomes a ``ModelStreamError``.

Requests go to an endpoint's instances in turn, except for **stateful sessions** ("Stateful
sessions with Amazon SageMaker AI models", the SageMaker developer guide): a request with
``SessionId`` (the ``X-Amzn-SageMaker-Session-Id`` header, forwarded) goes to the instance that
answered the session's ``NEW_SESSION`` request with ``X-Amzn-SageMaker-New-Session-Id`` (passed
back, as is ``X-Amzn-SageMaker-Closed-Session-Id``, so botocore reads ``NewSessionId`` and
``ClosedSessionId``); ``NEW_SESSION`` on the streaming operation is refused, as SageMaker refuses
it. An id the stand-in never saw goes to any instance; a session whose instance is unreachable
gets SageMaker's 424 ``ModelError``.

So botocore's own parsers — the event-stream decoder and its CRCs included — read the answers.
Not a model of SageMaker's limits, auth or load balancing: only its wire format and session
routing. Test hooks (``cut_stream_after_parts``) make a stream end early, to check that the
smoke test notices.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from tests.support.eventstream import model_stream_error, payload_part

SESSION_ID_HEADER = "X-Amzn-SageMaker-Session-Id"
NEW_SESSION_ID_HEADER = "X-Amzn-SageMaker-New-Session-Id"
CLOSED_SESSION_ID_HEADER = "X-Amzn-SageMaker-Closed-Session-Id"
NEW_SESSION = "NEW_SESSION"

PATH = re.compile(r"^/endpoints/(?P<name>[A-Za-z0-9-]{1,63})/"
                  r"(?P<kind>invocations|invocations-response-stream)$")


@dataclass
class StandinConfig:
    """Endpoint name → its instances' container base URLs (one URL: one instance), and how
    streams are cut into parts. ``invocations`` records ``"<operation> <endpoint> <instance>"``."""

    endpoints: Mapping[str, str | Sequence[str]]
    max_part_bytes: int = 4096
    cut_stream_after_parts: int | None = None
    timeout_s: float = 60.0
    invocations: list[str] = field(default_factory=list)

    def instances(self, endpoint: str) -> tuple[str, ...]:
        """The endpoint's instances (empty when there is no such endpoint)."""
        urls = self.endpoints.get(endpoint, ())
        return (urls,) if isinstance(urls, str) else tuple(urls)


class SessionRouter:
    """Round robin over an endpoint's instances, except that a session's requests go to the
    instance that opened it (thread-safe: the server handles requests in threads)."""

    def __init__(self, config: StandinConfig) -> None:
        self.config = config
        self.sessions: dict[str, str] = {}
        self._next: dict[str, int] = {}
        self._lock = threading.Lock()

    def pick(self, endpoint: str, session: str | None) -> str:
        """The instance for a request naming ``session`` (None, NEW_SESSION or an id)."""
        instances = self.config.instances(endpoint)
        with self._lock:
            if session is not None and session in self.sessions:
                return self.sessions[session]
            turn = self._next.get(endpoint, 0)
            self._next[endpoint] = turn + 1
            return instances[turn % len(instances)]

    def answered(self, instance: str, headers: Mapping[str, str]) -> dict[str, str]:
        """Note what the container said about sessions; the headers to pass back."""
        passed: dict[str, str] = {}
        with self._lock:
            opened = headers.get(NEW_SESSION_ID_HEADER)
            if opened:
                self.sessions[opened.split(";", 1)[0].strip()] = instance
                passed[NEW_SESSION_ID_HEADER] = opened
            closed = headers.get(CLOSED_SESSION_ID_HEADER)
            if closed:
                self.sessions.pop(closed, None)
                passed[CLOSED_SESSION_ID_HEADER] = closed
        return passed


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet: the smoke test prints what matters

    def do_POST(self) -> None:
        match = PATH.match(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if match is None:
            return self._error(404, "UnknownOperationException", f"no route for {self.path}")
        config = self.server.config
        if not config.instances(match["name"]):
            return self._error(400, "ValidationError",
                               f"Endpoint {match['name']} of account 123456789012 not found.")
        session = self.headers.get(SESSION_ID_HEADER)
        if match["kind"] != "invocations" and session == NEW_SESSION:
            return self._error(400, "ValidationError", "You can't create a stateful session by "
                               "using InvokeEndpointWithResponseStream; use InvokeEndpoint.")
        base = self.server.router.pick(match["name"], session)
        config.invocations.append(f"{match['kind']} {match['name']} {base}")
        forwarded = {"Content-Type": self.headers.get("Content-Type", "application/json")}
        if session is not None:
            forwarded[SESSION_ID_HEADER] = session
        if match["kind"] == "invocations":
            return self._invoke(base, body, forwarded)
        return self._invoke_stream(base, body, forwarded)

    def _invoke(self, base: str, body: bytes, forwarded: Mapping[str, str]) -> None:
        try:
            response = httpx.post(f"{base}/invocations", content=body, headers=forwarded,
                                  timeout=self.server.config.timeout_s)
        except httpx.HTTPError as error:
            return self._error(424, "ModelError", f"container unreachable: {error}")
        if response.status_code >= 300:
            return self._model_error(response.status_code, response.text)
        self._send(200, response.content, {
            "Content-Type": response.headers.get("content-type", "application/json"),
            "x-Amzn-Invoked-Production-Variant": "AllTraffic",
            **self.server.router.answered(base, response.headers)})

    def _invoke_stream(self, base: str, body: bytes, forwarded: Mapping[str, str]) -> None:
        config = self.server.config
        try:
            with httpx.stream("POST", f"{base}/invocations", content=body, headers=forwarded,
                              timeout=config.timeout_s) as response:
                if response.status_code >= 300:
                    response.read()
                    return self._model_error(response.status_code, response.text)
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.amazon.eventstream")
                self.send_header("X-Amzn-SageMaker-Content-Type",
                                 response.headers.get("content-type", "text/event-stream"))
                self.send_header("x-Amzn-Invoked-Production-Variant", "AllTraffic")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                parts = 0
                try:
                    for chunk in response.iter_raw():
                        for start in range(0, len(chunk), config.max_part_bytes):
                            if (config.cut_stream_after_parts is not None
                                    and parts >= config.cut_stream_after_parts):
                                return self._end_chunks()
                            self._chunk(payload_part(chunk[start:start + config.max_part_bytes]))
                            parts += 1
                except httpx.HTTPError as error:
                    self._chunk(model_stream_error(f"container stream broke: {error}"))
                self._end_chunks()
        except httpx.HTTPError as error:
            self._error(424, "ModelError", f"container unreachable: {error}")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _model_error(self, status: int, text: str) -> None:
        import json

        body = json.dumps({"Message": f"Received client error ({status}) from primary with "
                                      f"message \"{text[:1000]}\".",
                           "OriginalStatusCode": status, "OriginalMessage": text[:1000]})
        self._send(424, body.encode(), {"Content-Type": "application/json",
                                        "x-amzn-ErrorType": "ModelError"})

    def _error(self, status: int, code: str, message: str) -> None:
        import json

        self._send(status, json.dumps({"message": message}).encode(),
                   {"Content-Type": "application/json", "x-amzn-ErrorType": code})

    def _send(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], config: StandinConfig) -> None:
        super().__init__(address, _Handler)
        self.config = config
        self.router = SessionRouter(config)


class RuntimeStandin:
    """The stand-in on 127.0.0.1 in a background thread (``with RuntimeStandin(...) as s:``)."""

    def __init__(self, config: StandinConfig, port: int = 0) -> None:
        self.config = config
        self._server = _Server(("127.0.0.1", port), config)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> RuntimeStandin:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.runtime_standin",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", action="append", required=True, metavar="NAME=URL",
                        help="endpoint name and the container's base URL (repeatable)")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--max-part-bytes", type=int, default=4096)
    args = parser.parse_args(argv)
    endpoints: dict[str, list[str]] = {}
    for item in args.endpoint:
        name, sep, url = item.partition("=")
        if not sep or not url.startswith("http"):
            parser.error(f"--endpoint: {item!r} is not NAME=http://host:port")
        endpoints.setdefault(name, []).append(url.rstrip("/"))
    standin = RuntimeStandin(StandinConfig(endpoints, max_part_bytes=args.max_part_bytes),
                             port=args.port)
    print(f"SageMaker runtime stand-in on {standin.url}: {', '.join(endpoints)}", flush=True)
    with standin, contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
