"""What the two admission benchmarks share: the servers compared, how one request is sent and
timed, and the figures a run's outcomes come down to.

``admission_burst.py`` sends bursts all at once, ``admission_surge.py`` a sustained Poisson surge;
both compare the same servers, every one on the same engine arguments (``EngineConfig``):

* ``gateway``: ``serve --engine vllm`` with its deployed settings (only its metrics interval
  shortened to 1 s, so that a run's EMF lines are out before the next run);
* ``vllm``: vLLM's own OpenAI server with no admission cap (it queues everything);
* ``vllm-q<N>``: the same with vLLM 0.32's static valve ``--max-num-queued-tokens N``: a request
  arriving while the prompt tokens of the requests still in prefill are ≥ N gets 503;
* ``vllm-r<N>``: the same with ``--max-num-queued-reqs N``: 503 while N requests are in flight.

Every request names the LoRA adapter ``manga`` (a random rank-8 adapter on the tiny model,
loaded by every server), as two of three production requests do: the adapter's extra work per
token is part of what admission must account for.
A request is streamed on :class:`StreamClient`, a lean client for a burst's hundreds of requests
at once and a surge's hundreds a second; its outcome keeps the HTTP status, when its
headers left the client (the client's own queueing is not the server's), its first streamed chunk
(every server sends it at the engine's first token) and whether the gateway answered with a
fallback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import resource
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import engine_servers
from engine_servers import EngineConfig, Served, ServerProcess

from prompts import MANGA_CORPUS_EN, MANGA_CORPUS_JA

MAX_TOKENS = 64
REFUSAL_TARGET_MS = 50.0
MODEL_NAME = "manga"
"""What every request names: the adapter (:func:`served`)."""
REFUSED = (429, 503)
GATEWAY_ENV = {"GATEWAY_METRICS_INTERVAL_S": "1"}
"""The gateway's only setting beside the engine's: EMF gauges every second."""
CLIENT_TIMEOUT_S = 300.0
"""Per read: a request queued behind a long backlog (vLLM without a cap) still gets its answer."""


@dataclass
class Outcome:
    """One request, times in ms from its coroutine's start. ``status`` 0: no HTTP answer (a
    timeout or a broken connection)."""

    status: int
    first_ms: float
    total_ms: float
    fallback: bool = False
    sent_ms: float = 0.0
    """When the request's headers started out of the client, after the coroutine started (the
    client's own queueing under hundreds of coroutines on one event loop)."""
    lag_ms: float = 0.0
    """Open loop only: from the request's scheduled arrival to its coroutine's start."""

    @property
    def answered_ms(self) -> float:
        """From the request leaving the client to its answer's end: the server's time."""
        return self.total_ms - self.sent_ms

    @property
    def ttft_ms(self) -> float:
        """From the request leaving the client to its first streamed chunk."""
        return self.first_ms - self.sent_ms

    @property
    def refused(self) -> bool:
        return self.status in REFUSED


def served() -> Served:
    """The tiny model with the ``manga`` adapter every server loads."""
    model_dir = engine_servers.tiny_model(
        adapters=[engine_servers.AdapterFixture("manga_domain", rank=8, seed=1)])
    return Served(model_dir=model_dir, adapters={MODEL_NAME: "manga_domain"})


def chat(seed: int) -> list[dict[str, str]]:
    """A distinct 3-turn chat (no shared prefix beyond the template's first tokens)."""
    messages = [{"role": "system", "content": f"You are MangaAssist #{seed}, a manga shop "
                                              "assistant."}]
    for index in range(3):
        pool = MANGA_CORPUS_JA if (index + seed) % 2 else MANGA_CORPUS_EN
        messages.append({"role": "assistant" if index == 1 else "user",
                         "content": f"({seed}) " + " ".join(
                             pool[(index + seed + k) % len(pool)] for k in range(2))})
    return messages


TEMPLATE_TOKENS = 5
"""Tokens the tiny Llama-3's chat template adds around each message's content."""


def chat_prompt_tokens(messages: Sequence[Mapping[str, str]], tokens: Callable[[str], int]
                       ) -> int:
    """A chat's prompt in tokens as the template renders it: each message's content and
    :data:`TEMPLATE_TOKENS` around it, and 1 more (``tokens``: a text's count)."""
    return sum(tokens(message["content"]) + TEMPLATE_TOKENS for message in messages) + 1


def request_path(server: str) -> str:
    """The gateway's SageMaker path, or vLLM's OpenAI chat path."""
    return "/invocations" if server == "gateway" else "/v1/chat/completions"


STREAM_ERROR = 'data: {"error"'
"""A stream whose first event is an error document: vLLM's server answers a request its valve
refuses *after* the stream began (``--max-num-queued-tokens`` checked again in
``AsyncLLM.add_request``, when arrivals passed its first check together) with 200 and this event
instead of a token. It is a refusal, not an answer: counted with the status it carries."""


def stream_error_status(event: str) -> int:
    """The status code a stream's error event carries (503 when it names none)."""
    try:
        code = json.loads(event[len("data: "):])["error"].get("code")
    except (ValueError, KeyError, AttributeError):
        return 503
    return int(code) if isinstance(code, int) or str(code).isdigit() else 503


@dataclass
class _Exchange:
    """One request's moments (perf_counter) while it is under way."""

    started: float
    sent: float = 0.0
    first: float | None = None
    fallback: bool = False
    refused_in_stream: int = 0
    """The status a 200 stream's first event carried instead of a token (see STREAM_ERROR)."""

    def outcome(self, status: int) -> Outcome:
        end = time.perf_counter()
        sent = self.sent or self.started
        first = self.first if self.first is not None else end
        return Outcome(self.refused_in_stream or status, (first - self.started) * 1000,
                       (end - self.started) * 1000, self.fallback,
                       sent_ms=(sent - self.started) * 1000)


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
    headers = dict(line.split(b":", 1) for line in lines[1:] if b":" in line)
    return int(lines[0].split()[1]), {k.strip().lower(): v.strip() for k, v in headers.items()}


async def _read_chunked(reader: asyncio.StreamReader, exchange: _Exchange) -> None:
    """A chunked body to its end, noting the first SSE event and a fallback marker."""
    buffer = b""
    while True:
        while b"\r\n" not in buffer:
            buffer += await _more(reader)
        size_line, buffer = buffer.split(b"\r\n", 1)
        size = int(size_line.split(b";")[0], 16)
        while len(buffer) < size + 2:
            buffer += await _more(reader)
        data, buffer = buffer[:size], buffer[size + 2:]
        if size == 0:
            return
        if exchange.first is None and b"data: " in data:
            exchange.first = time.perf_counter()
            event = data[data.index(b"data: "):].decode("utf-8", "replace")
            if event.startswith(STREAM_ERROR):
                exchange.refused_in_stream = stream_error_status(event)
        if b'"fallback":{' in data:
            exchange.fallback = True


async def _more(reader: asyncio.StreamReader) -> bytes:
    data = await reader.read(65536)
    if not data:
        raise ConnectionError("the server closed the connection mid-answer")
    return data


class StreamClient:
    """A lean HTTP/1.1 client for the open and closed loops: keep-alive connections, no limit on
    how many, one streamed chat at a time per connection. httpx costs about 4.5 ms of
    CPU per streamed answer of 65 chunks, this about 1.2 ms (measured against a stub server),
    and 152 refusals sent at once came back with a p99 of 325 ms on httpx, 3 ms on this;
    on a machine of two cores, a client sending hundreds of requests per second must not take
    the CPU the server under test needs. ``sent`` is when the request was written to its
    connection, as httpx's trace (``send_request_headers.started``): after any connect."""

    IDLE_S = 2.0
    """A connection idle longer is not reused (vLLM's server closes them after 5 s)."""

    def __init__(self, url: str) -> None:
        address = url.split("://", 1)[1].rstrip("/")
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)
        self.idle: list[tuple[float, asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def __aenter__(self) -> StreamClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        for _at, _reader, writer in self.idle:
            writer.close()
        self.idle.clear()

    async def _connection(self) -> tuple[Connection, bool]:
        """An idle connection (True) or a new one (False)."""
        now = time.monotonic()
        while self.idle:
            at, reader, writer = self.idle.pop()
            if now - at < self.IDLE_S and not reader.at_eof():
                return (reader, writer), True
            writer.close()
        return await asyncio.open_connection(self.host, self.port), False

    async def chat(self, path: str, messages: list[dict[str, str]]) -> Outcome:
        """Send one streamed chat (``MAX_TOKENS``, temperature 0) and time it; status 0 when
        no answer came (a timeout, a broken connection)."""
        exchange = _Exchange(time.perf_counter())
        body = json.dumps({"model": MODEL_NAME, "messages": messages, "max_tokens": MAX_TOKENS,
                           "temperature": 0, "stream": True}).encode()
        request = (f"POST {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n"
                   "content-type: application/json\r\naccept: text/event-stream\r\n"
                   f"content-length: {len(body)}\r\n\r\n").encode() + body
        try:
            async with asyncio.timeout(CLIENT_TIMEOUT_S):
                return exchange.outcome(await self._exchange(request, exchange))
        except (OSError, EOFError, ValueError, IndexError, asyncio.LimitOverrunError):
            return exchange.outcome(0)  # TimeoutError and ConnectionError are OSErrors

    async def _send(self, request: bytes, exchange: _Exchange
                    ) -> tuple[Connection, int, dict[bytes, bytes]]:
        """Write the request and read its answer's head, again on a new connection (once) when
        an idle one turns out closed before any answer."""
        for attempt in range(2):
            (reader, writer), reused = await self._connection()
            exchange.sent = time.perf_counter()
            writer.write(request)
            try:
                status, headers = await _read_head(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()
                if reused and attempt == 0:
                    continue
                raise
            except BaseException:
                writer.close()
                raise
            return (reader, writer), status, headers
        raise ConnectionError("unreachable: the second attempt returns or raises")

    async def _exchange(self, request: bytes, exchange: _Exchange) -> int:
        """One request and its whole answer; the connection back to the idle ones after; the
        status."""
        (reader, writer), status, headers = await self._send(request, exchange)
        try:
            if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
                await _read_chunked(reader, exchange)
            else:
                await reader.readexactly(int(headers.get(b"content-length", b"0")))
        except BaseException:
            writer.close()
            raise
        if headers.get(b"connection", b"").lower() == b"close":
            writer.close()
        else:
            self.idle.append((time.monotonic(), reader, writer))
        return status


def raise_open_files_limit() -> None:
    """The soft limit on open files up to the hard one: a connection per request in flight."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def server_names(queued_tokens: Sequence[int], queued_reqs: Sequence[int] = ()) -> list[str]:
    """The gateway, vLLM without a cap, then one vLLM server per valve setting."""
    return ["gateway", "vllm", *(f"vllm-q{n}" for n in queued_tokens),
            *(f"vllm-r{n}" for n in queued_reqs)]


SERVER_PATTERN = "gateway, vllm, vllm-q<N> or vllm-r<N>"


def server_arg(text: str) -> str:
    """argparse type: a server name of :data:`SERVER_PATTERN`."""
    if text in ("gateway", "vllm") or (is_valve(text) and text[len("vllm-q"):].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not {SERVER_PATTERN}")


def is_valve(server: str) -> bool:
    return server.startswith(("vllm-q", "vllm-r"))


def valve_flags(server: str) -> list[str]:
    """vLLM's own flags for a server name: none for ``vllm``, the valve for ``vllm-q/r<N>``."""
    if not is_valve(server):
        return []
    flag = "--max-num-queued-tokens" if server.startswith("vllm-q") else "--max-num-queued-reqs"
    return [flag, server[len("vllm-q"):]]


@contextlib.contextmanager
def running(names: Sequence[str], served: Served, engine: EngineConfig, *, log_prefix: str
            ) -> Iterator[dict[str, ServerProcess]]:
    """Every named server started (in turn) and healthy; all stopped on leaving."""
    extra = {name: valve_flags(name) for name in names if name != "gateway"}
    with engine_servers.running(names, served, engine, log_prefix=log_prefix,
                                env={"gateway": GATEWAY_ENV}, extra=extra) as servers:
        yield servers


def process_tree(server: ServerProcess) -> list[int]:
    return [server.process.pid, *engine_servers.descendants(server.process.pid)]


def _process_cpu(pid: int) -> float:
    """CPU time (user + system) of one process so far (/proc); 0 when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def cpu_seconds(server: ServerProcess) -> float:
    """CPU time (user + system) of the server and every process below it so far (/proc)."""
    return sum(_process_cpu(pid) for pid in process_tree(server))


def cpu_split(server: ServerProcess) -> tuple[float, float]:
    """CPU time so far of the server's own process (the HTTP front end: parsing, rendering,
    tokenizing, streaming; the gateway's admission) and of the processes below it (the engine
    core): on a machine of few cores the first takes what the second needs."""
    front = _process_cpu(server.process.pid)
    return front, cpu_seconds(server) - front


def renice(server: ServerProcess, niceness: int) -> None:
    """Every thread of the server's processes at ``niceness`` (Linux's nice is per thread), so
    that on a machine of few cores the client gets the CPU it needs before the servers do."""
    for pid in process_tree(server):
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)


def percentile(values: Sequence[float], share: float) -> float:
    """Nearest rank (NaN when empty)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else math.nan


@dataclass(frozen=True)
class Figures:
    """One run's outcomes in figures (or the median of several runs')."""

    sent: float
    good: float
    admitted: float
    refused: float
    errors: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    refusal_p50_ms: float
    refusal_p99_ms: float
    refusal_max_ms: float


def figures(outcomes: Sequence[Outcome], slo_ms: float, *, from_sending: bool = True
            ) -> Figures:
    """``good``: 200, no fallback, first chunk within ``slo_ms`` (from the headers leaving the
    client, or with ``from_sending`` False from the coroutine's start); refusal times from the
    headers leaving the client."""
    def ttft(outcome: Outcome) -> float:
        return outcome.ttft_ms if from_sending else outcome.first_ms

    admitted = [ttft(o) for o in outcomes if o.status == 200]
    good = sum(1 for o in outcomes if o.status == 200 and not o.fallback and ttft(o) <= slo_ms)
    refusals = [o.answered_ms for o in outcomes if o.refused]
    return Figures(sent=len(outcomes), good=good, admitted=len(admitted),
                   refused=len(refusals), errors=len(outcomes) - len(admitted) - len(refusals),
                   ttft_p50_ms=percentile(admitted, 0.5), ttft_p99_ms=percentile(admitted, 0.99),
                   refusal_p50_ms=percentile(refusals, 0.5),
                   refusal_p99_ms=percentile(refusals, 0.99),
                   refusal_max_ms=max(refusals, default=math.nan))


NEAR_SLO_MARGINS_MS = (100.0, 200.0)
"""How far before the SLO a burst's starts are also counted (:func:`near_slo`)."""


@dataclass(frozen=True)
class NearSlo:
    """How near the SLO a burst's starts came (:func:`near_slo`)."""

    within: tuple[int, ...]
    """Starts within the SLO, then within each of :data:`NEAR_SLO_MARGINS_MS` before it."""
    last_within_ms: float
    """The last start within the SLO (NaN: none)."""
    first_after_ms: float
    """The first start after it (NaN: none)."""


def near_slo(starts_ms: Sequence[float], slo_ms: float) -> NearSlo:
    """How near the SLO the first tokens ``starts_ms`` came: an admission that decides on
    arrival, and must be sure that what it admits starts within the SLO, keeps at most the
    starts within its own error of it (docs/gateway.md#surges, "Fifteenth round")."""
    return NearSlo(
        within=tuple(sum(1 for t in starts_ms if t <= slo_ms - margin)
                     for margin in (0.0, *NEAR_SLO_MARGINS_MS)),
        last_within_ms=max((t for t in starts_ms if t <= slo_ms), default=math.nan),
        first_after_ms=min((t for t in starts_ms if t > slo_ms), default=math.nan))


WAVE_GAP_MS = 400.0
"""A gap between consecutive first tokens of a burst at least this long ends its first wave: on
the CPU build a wave's prefill steps start a batch every 0.1-0.35 s, and the next wave waits for
the first wave's answers to end (about a second)."""


@dataclass(frozen=True)
class Waves:
    """When a burst's first wave of starts ended and its second began (:func:`waves`)."""

    first_last_ms: float
    second_first_ms: float


def waves(starts_ms: Sequence[float], gap_ms: float = WAVE_GAP_MS) -> Waves | None:
    """The first gap of at least ``gap_ms`` between consecutive first tokens ``starts_ms``: the
    first wave's last start and the second wave's first (None: one wave)."""
    ordered = sorted(starts_ms)
    for before, after in itertools.pairwise(ordered):
        if after - before >= gap_ms:
            return Waves(before, after)
    return None


@dataclass(frozen=True)
class WavePace:
    """How a burst's second wave moves with its first, over rounds (:func:`wave_pace`)."""

    rounds: int
    first_last_ms: tuple[float, float, float]
    """The first wave's last start: p10, p50, p90 over the rounds."""
    second_first_ms: tuple[float, float, float]
    """The second wave's first start: p10, p50, p90."""
    slope: float
    """Least-squares ms of the second wave's start per ms of the first wave's end."""
    correlation: float


def wave_pace(found: Sequence[Waves]) -> WavePace | None:
    """The spread of both waves' starts and the fit of the second on the first over the rounds
    that had two waves (None: fewer than three, or no spread to fit). The second wave starts when
    the first wave's answers end, so it moves with the pace of that first wave — a pace an
    admission that decides on arrival has not seen yet (docs/gateway.md#surges)."""
    if len(found) < 3:
        return None
    first = [w.first_last_ms for w in found]
    second = [w.second_first_ms for w in found]

    def spread(values: list[float]) -> tuple[float, float, float]:
        return percentile(values, 0.1), median(values), percentile(values, 0.9)

    try:
        fit = statistics.linear_regression(first, second)
        correlation = statistics.correlation(first, second)
    except statistics.StatisticsError:
        return None
    return WavePace(len(found), spread(first), spread(second), fit.slope, correlation)


@dataclass(frozen=True)
class Ceiling:
    """What the engine can serve at best, measured on vLLM's server without a cap: the most
    requests a second that closed loops of several sizes completed (``rate``, at ``clients``),
    and the most requests its pool holds at once (``held``: the pool's blocks over the blocks of
    the mix's smallest prompt and its first token, as vLLM admits them)."""

    rate: float
    clients: int
    held: int

    def bound(self, duration_s: float, slo_s: float) -> float:
        """The most answers within the SLO any admission could give to arrivals over
        ``duration_s``: each had its first token within ``duration_s + slo_s`` of the first
        arrival, and by then either ended (at most ``rate`` a second from an idle start) or is
        still running (at most ``held``). An upper bound as good as ``rate`` is the engine's
        best: the closed loops' sizes are the ones tried, not every one, and their pace is the
        machine's while they ran (a run at another moment can pass it)."""
        return self.rate * (duration_s + slo_s) + self.held


def best_closed_loop(rates: Mapping[int, float]) -> tuple[int, float]:
    """The closed loop (clients, completed requests a second) that completed the most."""
    if not rates:
        raise ValueError("rates must name at least one closed loop")
    clients = max(rates, key=lambda size: rates[size])
    return clients, rates[clients]


def median(values: Sequence[float]) -> float:
    """The median of the values that are not NaN (NaN when none is)."""
    known = [value for value in values if not math.isnan(value)]
    return statistics.median(known) if known else math.nan


def median_figures(runs: Sequence[Figures]) -> Figures:
    """Each figure's median over the runs (a figure no run had, e.g. no refusal: NaN)."""
    return Figures(**{f.name: median([getattr(run, f.name) for run in runs])
                      for f in fields(Figures)})


def best_valve(good: Mapping[str, float]) -> str | None:
    """The valve server with the most good answers (the first listed on a tie), if any."""
    valves = [name for name in good if is_valve(name)]
    return max(valves, key=lambda name: good[name]) if valves else None


def cell(value: float, spec: str = ".0f") -> str:
    """A table cell: ``–`` for a figure that does not exist (NaN)."""
    return "–" if math.isnan(value) else format(value, spec)


def ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.2f}×" if denominator else ("–" if not numerator else "∞")
