"""The prefill valve decides before a request is parsed when it can: while not even the smallest
prompt would start within the SLO, a chat request is refused with the valve's 429 from its raw
body (no JSON parsing, validation, rendering or tokenizing), counted in the ``Unsized`` bucket;
session requests, warmup requests and everything the valve would admit go the whole way."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
from starlette.background import BackgroundTask
from starlette.responses import Response

from gateway.api.edge import BODY_SCOPE_KEY, ArrivalScreen, StartGate
from gateway.app import GatewayRuntime
from tests.containers.llm.test_cold_start import running, short_chat
from tests.containers.llm.test_telemetry import assert_valid_emf

FAST = {"SIM_STEP_TIME_S": "0.002", "SIM_EOS_PROBABILITY": "0", "GATEWAY_TTFT_SLO_S": "1.0"}


def fill_the_valve(runtime: GatewayRuntime) -> None:
    """Two prompts waiting for their first token that hold far more than the valve's cap (the
    valve counts a backlog, whoever put it there)."""
    valve = runtime.admission.valve
    now = runtime.clock()
    for key in ("held-a", "held-b"):
        valve.enter(key, 10 * int(valve.cap(now)) + 1000, now)


def rejections(lines: list[str], since: int) -> list[dict[str, Any]]:
    documents = [json.loads(line) for line in lines[since:]]
    return [document for document in documents if "AdmissionRejections" in document]


def test_a_full_valve_refuses_a_chat_request_before_parsing_it(make_runtime: Any) -> None:
    runtime, lines = make_runtime(**FAST)

    async def scenario() -> tuple[list[httpx.Response], httpx.Response, int]:
        async with running(runtime) as client:
            fill_the_valve(runtime)
            since = len(lines)
            refused = [
                await client.post("/invocations", json=short_chat(0)),
                await client.post("/v1/chat/completions", json={**short_chat(1), "stream": True}),
                # Not even JSON: only a parse would find out; the valve refuses it first.
                await client.post("/invocations", content=b'{"messages": [',
                                  headers={"content-type": "application/json"}),
            ]
            session = await client.post("/invocations", json={"requestType": "NEW_SESSION"})
            return refused, session, since

    refused, session, since = asyncio.run(scenario())
    for response in refused:
        assert response.status_code == 429, response.text
        assert int(response.headers["retry-after"]) >= 1
        error = response.json()["error"]
        assert error["code"] == "ttft_slo"
        assert "so a request of the usual size would miss it" in error["message"]
    assert session.status_code == 200  # a session request is not a chat request
    shed = rejections(lines, since)
    assert len(shed) == 3
    for document in shed:
        assert_valid_emf(document)
        assert document["Bucket"] == "Unsized"
        assert document["queue_wait_ms"] == 0.0
    assert [document["stream"] for document in shed] == [False, True, False]
    assert runtime.admission.arrivals.refused_by_valve == 3


def test_an_open_valve_reads_every_request(make_runtime: Any) -> None:
    """With nothing waiting the valve admits anything (its floor): the request is parsed and
    answered as usual, a malformed one with its 400."""
    runtime, _ = make_runtime(**FAST)

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with running(runtime) as client:
            served = await client.post("/invocations", json=short_chat(0))
            bad = await client.post("/invocations", content=b'{"messages": [',
                                    headers={"content-type": "application/json"})
            return served, bad

    served, bad = asyncio.run(scenario())
    assert served.status_code == 200
    assert bad.status_code == 400


def test_warmup_requests_pass_a_full_valve(make_runtime: Any) -> None:
    """Warmup measures the rate the valve decides by, so the valve never refuses it."""
    runtime, _ = make_runtime(**FAST)

    async def scenario() -> httpx.Response:
        async with running(runtime) as client:
            fill_the_valve(runtime)
            return await client.post("/invocations", json=short_chat(0), headers={
                "x-mangaassist-warmup": runtime.lifecycle.warmup_token})

    assert asyncio.run(scenario()).status_code == 200


def test_while_the_engine_is_rebuilt_a_request_gets_a_503_at_once(make_runtime: Any) -> None:
    """From an engine's death until the rebuilt one has warmed up, a chat request is answered
    503 ``engine_unavailable`` before it is parsed, its Retry-After the rebuild's expected
    remaining time; a session request still goes through."""
    from gateway.engines.base import EngineDead

    runtime, _ = make_runtime(**FAST, GATEWAY_ENGINE_RESTART_BACKOFF_S="0.5",
                              GATEWAY_RETRY_AFTER_S="1")

    async def scenario() -> tuple[httpx.Response, float, httpx.Response]:
        async with running(runtime) as client:
            runtime.supervisor.started_in(30.0)
            assert runtime.supervisor.report_death(0, EngineDead("test"))
            started = asyncio.get_running_loop().time()
            refused = await client.post("/invocations", content=b'{"messages": [',
                                        headers={"content-type": "application/json"})
            elapsed = asyncio.get_running_loop().time() - started
            session = await client.post("/invocations", json={"requestType": "NEW_SESSION"})
            return refused, elapsed, session

    refused, elapsed, session = asyncio.run(scenario())
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "engine_unavailable"
    assert "being rebuilt after a failure" in refused.json()["error"]["message"]
    assert 28 <= int(refused.headers["retry-after"]) <= 30
    assert elapsed < 0.25
    assert session.status_code == 200


def test_the_start_gate_lets_one_start_through_per_loop_iteration() -> None:
    """Three requests screened in the same iteration start in arrival order, one per iteration
    of the event loop, and what the loop had ready in between (the next arrivals' screens) runs
    before the next start; a request that goes away while it waits does not hold the rest."""

    async def scenario() -> list[str]:
        gate = StartGate()
        order: list[str] = []

        async def start(name: str) -> None:
            await gate.turn()
            order.append(name)

        async def screen(name: str) -> None:
            order.append(name)

        starts = [asyncio.create_task(start(name)) for name in ("a", "b", "gone", "c")]
        await asyncio.sleep(0)  # their first steps: a starts, the others wait for a turn
        assert order == ["a"] and gate.waiting == 3
        starts[2].cancel()
        screens = [asyncio.create_task(screen(name)) for name in ("x", "y")]
        async with asyncio.timeout(5):  # a gate that never lets one through fails, not hangs
            await asyncio.gather(*starts[:2], starts[3], *screens)
        return order

    assert asyncio.run(scenario()) == ["a", "x", "y", "b", "c"]


def test_no_two_requests_start_in_one_loop_iteration() -> None:
    """A ticker counts the loop's iterations. Four requests let through in one iteration start
    in an iteration each; one more arrives (its first step) in the iteration the last of them
    starts in, after the gate's own callback there: it waits for an iteration of its own (a
    gate reopened in that iteration let it start beside the last one)."""

    async def scenario() -> dict[str, int]:
        loop = asyncio.get_running_loop()
        gate = StartGate()
        iteration = 0
        started: dict[str, int] = {}
        tasks: list[asyncio.Task[None]] = []

        def tick() -> None:
            nonlocal iteration
            iteration += 1
            if len(started) < 5:
                loop.call_soon(tick)

        def watch() -> None:
            """Runs after the gate's callback in every iteration (scheduled after it first):
            once the last waiting request has been let through, a new arrival."""
            if "c" in started and not gate.waiting:
                tasks.append(asyncio.create_task(start("late")))
            else:
                loop.call_soon(watch)

        async def start(name: str) -> None:
            await gate.turn()
            started[name] = iteration
            if name == "a":
                loop.call_soon(watch)

        tick()
        tasks.extend(asyncio.create_task(start(name)) for name in "abcd")
        async with asyncio.timeout(5):  # a gate that never lets one through fails, not hangs
            while len(tasks) < 5 or not all(task.done() for task in tasks):
                await asyncio.sleep(0)
        return started

    started = asyncio.run(scenario())
    assert sorted(started, key=started.__getitem__) == ["a", "b", "c", "d", "late"]
    assert len(set(started.values())) == 5, started


class _Ticker:
    """A callback in every loop iteration (the first run at once): it counts the iterations,
    advances a clock by ``seconds_per_iteration`` and screens an arrival at ``gate`` in each of
    the first ``screened_iterations``, until ``until()``."""

    def __init__(self, gate: StartGate, screened_iterations: int,
                 seconds_per_iteration: float, *, until: Callable[[], bool]) -> None:
        self.gate = gate
        self.screened_iterations = screened_iterations
        self.seconds_per_iteration = seconds_per_iteration
        self.until = until
        self.iteration = 0
        self.now = 0.0
        self.tick()

    def tick(self) -> None:
        self.iteration += 1
        self.now += self.seconds_per_iteration
        if self.iteration <= self.screened_iterations:
            self.gate.screened()
        if not self.until():
            asyncio.get_running_loop().call_soon(self.tick)


def _starts_beside_screens(screened_iterations: int, seconds_per_iteration: float
                           ) -> dict[str, int]:
    """Two requests ask to start at once while an arrival is screened in each of the loop's
    first ``screened_iterations`` iterations (a clock advancing ``seconds_per_iteration`` an
    iteration, the gate's yield bound 1 s): the iteration each starts in."""

    async def scenario() -> dict[str, int]:
        started: dict[str, int] = {}
        ticker = _Ticker(StartGate(yield_max_s=1.0, clock=lambda: ticker.now),
                         screened_iterations, seconds_per_iteration,
                         until=lambda: len(started) == 2)

        async def start(name: str) -> None:
            await ticker.gate.turn()
            started[name] = ticker.iteration

        tasks = [asyncio.create_task(start(name)) for name in "ab"]
        async with asyncio.timeout(5):  # a gate that never lets one through fails, not hangs
            await asyncio.gather(*tasks)
        return started

    return asyncio.run(scenario())


def test_a_waiting_start_yields_to_a_burst_until_an_iteration_screens_no_arrival() -> None:
    """The first request starts at once (in the iteration after the ticker's first, 2); without
    screens the second starts two iterations later (4). With an arrival screened in each of
    the first 20 iterations it waits, their refusals going first, and starts two iterations
    after the last screen (22). (The gate before let it start in 4 among the screens.)"""
    assert _starts_beside_screens(screened_iterations=0, seconds_per_iteration=0.0) == {
        "a": 2, "b": 4}
    assert _starts_beside_screens(screened_iterations=20, seconds_per_iteration=0.0) == {
        "a": 2, "b": 22}


def test_a_waiting_start_yields_to_the_screens_for_at_most_the_bound() -> None:
    """Arrivals screened in every iteration without end (a flood) hold a waiting start for
    ``yield_max_s`` and no longer: at 0.25 s an iteration, the second request, waiting from
    iteration 2, has waited 1 s in iteration 6 and starts in the next one (7)."""
    assert _starts_beside_screens(screened_iterations=10**9, seconds_per_iteration=0.25) == {
        "a": 2, "b": 7}


def _settles_beside_screens(screened_iterations: int, seconds_per_iteration: float, *,
                            start_waits: bool = False) -> int:
    """One caller waits in :meth:`StartGate.settled` while an arrival is screened in each of
    the loop's first ``screened_iterations`` iterations (``start_waits``: and a request waits
    for its turn to start until then); the iteration it returns in (a clock advancing
    ``seconds_per_iteration`` an iteration, the gate's settle bound 1 s, its yield bound far
    longer)."""

    async def scenario() -> int:
        settled_in: list[int] = []
        ticker = _Ticker(StartGate(yield_max_s=100.0, settle_max_s=1.0,
                                   clock=lambda: ticker.now),
                         screened_iterations, seconds_per_iteration,
                         until=lambda: bool(settled_in))

        async def after() -> None:
            await ticker.gate.settled()
            settled_in.append(ticker.iteration)

        tasks = [asyncio.create_task(after())]
        if start_waits:
            tasks += [asyncio.create_task(ticker.gate.turn()) for _ in range(2)]
        async with asyncio.timeout(5):
            await asyncio.gather(*tasks)
        return settled_in[0]

    return asyncio.run(scenario())


def test_what_a_refusal_leaves_for_after_waits_for_the_burst_to_be_screened_and_started(
) -> None:
    """A caller of ``settled`` (the task that writes a refusal's log line) asks in the
    ticker's second iteration. Without screens the gate looks in the third, finds it quiet and
    the caller returns in the fourth. With an arrival screened in each of the first 20
    iterations it returns two iterations after the last screen (22); with a request also
    waiting for its turn to start (let through after the screens), one later (23): the
    burst's refusals and starts go first."""
    assert _settles_beside_screens(screened_iterations=0, seconds_per_iteration=0.0) == 4
    assert _settles_beside_screens(screened_iterations=20, seconds_per_iteration=0.0) == 22
    assert _settles_beside_screens(screened_iterations=20, seconds_per_iteration=0.0,
                                   start_waits=True) == 23


def test_what_a_refusal_leaves_for_after_waits_for_the_screens_for_at_most_the_bound() -> None:
    """Arrivals screened in every iteration without end (a flood): the caller waits
    ``settle_max_s`` and no longer (at 0.25 s an iteration, asking in iteration 2 it has
    waited 1 s in iteration 6, and returns in the next)."""
    assert _settles_beside_screens(screened_iterations=10**9, seconds_per_iteration=0.25) == 7


def test_a_refusals_log_line_is_written_after_the_refusals_behind_it() -> None:
    """Through the middleware: eight refusals, one arriving in each loop iteration, each with
    its log line as the response's background task. Every answer goes out before any line is
    written (each line about 40 us of the loop in a burst), and every line is written. (The
    code before wrote each line right after its own answer, before the next refusal.)"""

    async def scenario() -> list[str]:
        events: list[str] = []

        async def log(path: str) -> None:
            events.append("logged " + path)

        def screen(scope: dict[str, Any], body: bytes) -> Response:
            return Response(status_code=429, background=BackgroundTask(log, scope["path"]))

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            raise AssertionError("nothing is let through")

        middleware = ArrivalScreen(app, screen=screen)

        async def request(path: str) -> None:
            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    events.append("refused " + path)

            await middleware({"type": "http", "path": path, BODY_SCOPE_KEY: b"{}"},
                             receive, send)

        tasks = []
        for index in range(8):
            tasks.append(asyncio.create_task(request(f"/{index}")))
            await asyncio.sleep(0)
        async with asyncio.timeout(5):
            await asyncio.gather(*tasks)
        return events

    events = asyncio.run(scenario())
    assert events[:8] == [f"refused /{index}" for index in range(8)]
    assert sorted(events[8:]) == [f"logged /{index}" for index in range(8)]


def test_the_arrival_screen_holds_the_starts_while_it_answers_a_burst() -> None:
    """Through the middleware: two arrivals let through, then one refused in each of the next
    eight loop iterations. The first starts at once; the second starts after the eighth
    refusal, not among them (each screen tells the gate that a burst is still arriving)."""

    class Passed:
        tokens = 1.0

        def release(self) -> None:
            """Nothing counted it."""

    async def scenario() -> list[str]:
        events: list[str] = []
        lets_through = iter([True, True] + [False] * 8)

        def screen(scope: dict[str, Any], body: bytes) -> Response | Passed:
            if next(lets_through):
                return Passed()
            events.append("refused " + scope["path"])
            return Response(status_code=429)

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            events.append("started " + scope["path"])
            await Response()(scope, receive, send)

        middleware = ArrivalScreen(app, screen=screen)

        async def request(path: str) -> None:
            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(message: dict[str, Any]) -> None:
                """The answer goes nowhere."""

            await middleware({"type": "http", "path": path, BODY_SCOPE_KEY: b"{}"},
                             receive, send)

        tasks = [asyncio.create_task(request("/a")), asyncio.create_task(request("/b"))]
        for index in range(8):
            await asyncio.sleep(0)
            tasks.append(asyncio.create_task(request(f"/{index}")))
        async with asyncio.timeout(5):
            await asyncio.gather(*tasks)
        return events

    assert asyncio.run(scenario()) == [
        "started /a", *(f"refused /{index}" for index in range(8)), "started /b"]


def test_a_burst_is_screened_before_its_admitted_requests_start(make_runtime: Any) -> None:
    """Thirty chat requests at once, the valve's cap a few requests: every one is screened (and
    the rest refused, before parsing) before the second admitted one starts. Before the start
    gate each admitted request was parsed, rendered and tokenized before the next arrival was
    screened, so the refusals waited for all of the admitted starts."""
    runtime, _ = make_runtime(**FAST)
    admission = runtime.admission
    order: list[str] = []
    screen, acquire = admission.screen, admission.acquire

    def screened(smallest: int) -> Any:
        decided = screen(smallest)
        order.append("screen")
        return decided

    async def acquired(*args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("by_valve", True):
            return await acquire(*args, **kwargs)
        order.append("start")
        return await acquire(*args, **kwargs)

    async def scenario() -> list[httpx.Response]:
        async with running(runtime) as client:
            valve = admission.valve
            valve.reset(500.0 / valve.target_s)  # a cap of 500 prompt tokens
            admission.prefill.reset(valve.rate)  # and the engine's prefill as slow
            valve.step_tokens = 0  # and no batch the engine takes in one step
            admission.prompt_mean = 100.0
            admission.screen, admission.acquire = screened, acquired  # type: ignore[method-assign]
            return list(await asyncio.gather(*(client.post("/invocations", json=short_chat(i))
                                               for i in range(30))))

    responses = asyncio.run(scenario())
    statuses = [response.status_code for response in responses]
    assert statuses.count(200) >= 2 and statuses.count(429) >= 20, (statuses, order)
    assert order.count("screen") == 30
    second_start = [index for index, what in enumerate(order) if what == "start"][1]
    assert order[:second_start].count("screen") == 30, order
    # every refusal was the screen's (decided beside the screened-in requests, before parsing),
    # none of them counted as a refusal while idle (the engine had the burst's first ones)
    for response in responses:
        if response.status_code == 429:
            assert "a request of the usual size would miss it" in response.json()["error"][
                "message"]
    assert admission.arrivals.refused_while_idle == 0
    assert admission.pending_tokens == 0
