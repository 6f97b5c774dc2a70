"""Gateway overhead: the real gateway on a zero-latency simulated engine vs a bare FastAPI endpoint.

Both servers run side by side in this one run, as separate uvicorn processes on this machine:

* **gateway** — ``tests/support/sim_serve.py --engine sim`` with a zero-latency simulator:
  validation, routing, the sliding-window context budget in the served model's tokens,
  admission, generation of ``--max-tokens`` simulated tokens, the OpenAI response and the
  per-request EMF line.
* **bare** — a FastAPI endpoint that only parses the same body with the same request model and
  returns a fixed answer.

For 5-, 30- and 60-turn conversations (≈100 tokens a turn, Japanese and English) it prints p50/p99
latency at concurrency 1, requests/s at concurrency 32 and the server processes' CPU time per
request (robust when other work shares the machine; latency rounds alternate between the two
servers for the same reason), and the ratios the issue sets targets for: gateway p50 at 30
turns within 1.5x the bare endpoint; gateway 60-turn p50 within 1.3x its 5-turn p50. A
benchmark, not a test: it prints figures and exits 0 (``--check``: exit 1 if a target is missed).

    python benchmarks/gateway_overhead.py [--requests 400] [--seconds 5] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
LLM_DIR = REPO / "containers" / "llm"
sys.path[:0] = [str(REPO), str(LLM_DIR)]

from tokenizers import Tokenizer  # noqa: E402

from prompts import SYSTEM_PROMPT_EN  # noqa: E402
from tests.support.demo_model import synthetic_conversation, write_model_dir  # noqa: E402
from tests.support.network import free_port  # noqa: E402

TURNS = (5, 30, 60)
JSON_HEADERS = {"content-type": "application/json"}

BARE_APP = textwrap.dedent("""
    import sys, time, uuid
    sys.path[:0] = [{repo!r}, {llm!r}]
    from fastapi import FastAPI
    from gateway.api.protocol import ChatCompletionRequest

    app = FastAPI()
    ANSWER = {{"object": "chat.completion", "model": "bare",
              "choices": [{{"index": 0, "message": {{"role": "assistant",
                                                   "content": "fixed answer"}},
                           "finish_reason": "stop"}}],
              "usage": {{"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}}}

    @app.post("/invocations")
    async def invocations(body: ChatCompletionRequest) -> dict:
        return {{**ANSWER, "id": "chatcmpl-" + uuid.uuid4().hex, "created": int(time.time())}}

    @app.get("/ping")
    async def ping() -> dict:
        return {{"status": "healthy"}}
""")


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            if httpx.get(url + "/ping", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become healthy in {timeout_s} s")


def start_gateway(model_dir: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    # The benchmark measures the request path, not admission: the longest SLO accepted (59 s,
    # under SageMaker's 60 s invocation timeout) keeps every request admitted, so both servers
    # are measured on the same work. (Issues 22-30's first-token forecast priced each request's
    # whole 612-token prompt although the prefix cache held 608 of them, and refused at
    # concurrency 32; issue 37's prefill valve counts prompts whole too, as vLLM's does.)
    env = {**os.environ, "GATEWAY_MODEL_DIR": str(model_dir), "SIM_EOS_PROBABILITY": "0",
           "ENGINE_NUM_GPU_BLOCKS": "8192", "GATEWAY_METRICS_INTERVAL_S": "60",
           "GATEWAY_TTFT_SLO_S": "59"}
    log = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "support" / "sim_serve.py"), "--engine", "sim",
         "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    return process, f"http://127.0.0.1:{port}"


def start_bare(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    (workdir / "bare_app.py").write_text(BARE_APP.format(repo=str(REPO), llm=str(LLM_DIR)))
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "bare_app:app", "--host", "127.0.0.1", "--port",
         str(port), "--log-level", "warning", "--no-access-log"],
        cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    return process, f"http://127.0.0.1:{port}"


def latency_samples(client: httpx.Client, body: bytes, count: int) -> list[float]:
    """``count`` sequential request latencies in milliseconds on one keep-alive connection."""
    samples: list[float] = []
    for _ in range(count):
        started = time.perf_counter()
        response = client.post("/invocations", content=body, headers=JSON_HEADERS)
        elapsed = time.perf_counter() - started
        if response.status_code != 200:
            raise RuntimeError(f"{client.base_url}: {response.status_code} {response.text[:200]}")
        samples.append(elapsed * 1000)
    return samples


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


async def throughput(url: str, body: bytes, concurrency: int, seconds: float) -> tuple[int, float]:
    """Requests completed by ``concurrency`` clients in ``seconds`` (count, elapsed)."""
    done = 0
    stop_at = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits) as client:
        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                response = await client.post("/invocations", content=body, headers=JSON_HEADERS)
                if response.status_code != 200:
                    raise RuntimeError(f"{url}: {response.status_code} {response.text[:200]}")
                done += 1
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done, time.perf_counter() - started


def request_bodies(tokenizer: Tokenizer, max_tokens: int) -> dict[int, bytes]:
    """One request body per conversation length (≈100 tokens a turn, Japanese and English)."""
    bodies: dict[int, bytes] = {}
    for turns in TURNS:
        conversation = synthetic_conversation(tokenizer, turns=turns, tokens_per_turn=100, seed=7)
        messages = [{"role": "system", "content": SYSTEM_PROMPT_EN}, *conversation]
        bodies[turns] = json.dumps(
            {"model": "manga", "messages": messages, "max_tokens": max_tokens},
            ensure_ascii=False,
        ).encode("utf-8")
    return bodies


def measure_case(urls: dict[str, str], pids: dict[str, int], clients: dict[str, httpx.Client],
                 body: bytes, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """p50/p99, requests/s and server CPU per request of each server for one request body.

    Measurements alternate between the servers, so background load hits both alike.
    """
    rounds = 10
    samples: dict[str, list[float]] = {name: [] for name in urls}
    cpu = dict.fromkeys(urls, 0.0)
    for client in clients.values():
        latency_samples(client, body, 20)  # warm caches and connections
    for _ in range(rounds):
        for name, client in clients.items():
            before = cpu_seconds(pids[name])
            samples[name] += latency_samples(client, body, max(1, args.requests // rounds))
            cpu[name] += cpu_seconds(pids[name]) - before
    print(" throughput ...", end="", flush=True)
    counts: dict[str, list[float]] = {name: [0, 0.0] for name in urls}
    for _ in range(3):
        for name, url in urls.items():
            done, elapsed = asyncio.run(throughput(url, body, args.concurrency, args.seconds / 3))
            counts[name][0] += done
            counts[name][1] += elapsed
    return {name: {"p50": statistics.median(samples[name]),
                   "p99": percentile(samples[name], 0.99),
                   "rps": counts[name][0] / counts[name][1],
                   "cpu_ms": cpu[name] / len(samples[name]) * 1000} for name in urls}


def report(results: dict[tuple[str, int], dict[str, float]], concurrency: int) -> bool:
    """Print the table and the ratios; whether both targets were met."""
    print()
    print(f"{'server':8s} {'turns':>5s} {'p50 ms':>8s} {'p99 ms':>8s} "
          f"{'req/s @' + str(concurrency):>10s} {'server CPU ms/req':>18s}")
    for turns in TURNS:
        for name in ("bare", "gateway"):
            row = results[(name, turns)]
            print(f"{name:8s} {turns:5d} {row['p50']:8.2f} {row['p99']:8.2f} {row['rps']:10.0f}"
                  f" {row['cpu_ms']:18.3f}")
    print()
    overhead = {t: results[("gateway", t)]["p50"] / results[("bare", t)]["p50"] for t in TURNS}
    for turns in TURNS:
        print(f"gateway/bare p50 at {turns:2d} turns: {overhead[turns]:.2f}x")
    for turns in TURNS:
        ratio = results[("gateway", turns)]["cpu_ms"] / results[("bare", turns)]["cpu_ms"]
        print(f"gateway/bare server CPU per request at {turns:2d} turns: {ratio:.2f}x")
    growth = results[("gateway", 60)]["p50"] / results[("gateway", 5)]["p50"]
    bare_growth = results[("bare", 60)]["p50"] / results[("bare", 5)]["p50"]
    print(f"gateway p50 60 turns / 5 turns: {growth:.2f}x "
          f"(the bare endpoint alone, parsing the larger body: {bare_growth:.2f}x)")
    met_overhead = overhead[30] <= 1.5
    met_growth = growth <= 1.3
    print(f"target p50(30 turns) <= 1.5x bare: {'met' if met_overhead else 'MISSED'}")
    print(f"target p50(60 turns) <= 1.3x p50(5 turns): {'met' if met_growth else 'MISSED'}")
    return met_overhead and met_growth


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="latency samples per case")
    parser.add_argument("--seconds", type=float, default=5.0, help="throughput run per case")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens the sim generates")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    model_dir = write_model_dir(workdir / "model")
    bodies = request_bodies(Tokenizer.from_file(str(model_dir / "tokenizer.json")),
                            args.max_tokens)
    print(f"starting gateway (sim, zero latency) and bare endpoint; logs in {workdir}",
          flush=True)
    gateway, gateway_url = start_gateway(model_dir, workdir / "gateway.log")
    bare, bare_url = start_bare(workdir)
    results: dict[tuple[str, int], dict[str, float]] = {}
    urls = {"bare": bare_url, "gateway": gateway_url}
    pids = {"bare": bare.pid, "gateway": gateway.pid}
    try:
        wait_healthy(gateway_url, gateway)
        wait_healthy(bare_url, bare)
        clients = {name: httpx.Client(base_url=url, timeout=30.0) for name, url in urls.items()}
        for turns in TURNS:
            print(f"{turns} turns ({len(bodies[turns])} bytes): latency x{args.requests} per "
                  "server ...", end="", flush=True)
            case = measure_case(urls, pids, clients, bodies[turns], args)
            results.update({(name, turns): row for name, row in case.items()})
            print(" done", flush=True)
        for client in clients.values():
            client.close()
    finally:
        for process in (gateway, bare):
            process.terminate()
            process.wait(timeout=30)
    met = report(results, args.concurrency)
    return 1 if args.check and not met else 0


if __name__ == "__main__":
    sys.exit(main())
