"""Measure time to first token and time per output token by batch size, through a server.

``tools/gpu_smoke.sh`` runs this on a GPU once the gateway is up; it is what turns the
decode-speed table's assumptions into measurements. For each batch size ``B`` it keeps ``B``
streamed chat requests in flight (a closed loop: each worker sends its next request as soon as
the last one finished), each with a prompt of about ``--prompt-tokens`` tokens and
``max_tokens = --output-tokens``, and times every request on the client:

* **TTFT** — from sending the request to the first content chunk;
* **TPOT** — from the first to the last content chunk, divided by the generated tokens after the
  first (``usage.completion_tokens`` from the stream's final chunk, ``stream_options:
  include_usage``).

p50 and p99 (nearest rank) of each, per batch size, become a profile of the table
(:mod:`capacity_model.decode_speed`), every point ``measured`` with its source; ``--write``
replaces the profile of the same key in the table file (``config/decode_speed.json``), leaving
the others as they are.

    python -m tools.decode_bench --url http://127.0.0.1:8080 --batch-sizes 1,8,32 \\
        --key "NVIDIA A10G|llama-3-8b-instruct|w4a16 int4 g128|auto" \\
        --prompt-tokens 900 --output-tokens 190 --write config/decode_speed.json

Each point's source names what was measured: ``--target`` says what answers at ``--url``
(default ``the gateway``; e.g. ``--target "vLLM's own server"`` when pointed at the engine
directly), so a profile reads "through the gateway" only when it was.

The prompt is sized with one calibration request (a non-streamed request's
``usage.prompt_tokens``), so the measurement uses the served model's own tokenizer.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from capacity_model.decode_speed import (
    DecodePoint,
    DecodeProfile,
    DecodeSpeedTable,
    Latency,
    parse_decode_table,
)
from tools.capacity.arguments import batch_sizes_argument

FILLER = ("Which manga series are like One Piece, with a long adventure, a crew of friends and "
          "a world full of islands? ")
ASK = ("Now list as many manga titles as you can, one per line, with a sentence about each, "
       "and do not stop early.")


_SERIAL = itertools.count(1)


class BenchError(RuntimeError):
    """The gateway did not answer as a benchmark needs; the message says what it did."""


@dataclass(frozen=True)
class RequestTiming:
    """One streamed request as the client saw it."""

    ttft_s: float
    tpot_s: float | None
    completion_tokens: int


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in (0, 1])."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(fraction * len(ordered))) - 1]


def prompt_of(words: int) -> str:
    """A user message of about ``words`` words of manga chatter, ending with the request."""
    filler = (FILLER * (words // len(FILLER.split()) + 1)).split()[:words]
    return " ".join(filler) + " " + ASK


async def calibrate(client: httpx.AsyncClient, prompt_tokens: int) -> str:
    """A prompt the served model counts as about ``prompt_tokens`` tokens."""
    probe_words = 200
    response = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": prompt_of(probe_words)}], "max_tokens": 1})
    if response.status_code != 200:
        raise BenchError(f"calibration request answered {response.status_code}: "
                         f"{response.text[:300]}")
    counted = int(response.json()["usage"]["prompt_tokens"])
    words = max(1, round(probe_words * prompt_tokens / counted))
    return prompt_of(words)


async def one_request(client: httpx.AsyncClient, prompt: str, output_tokens: int) -> RequestTiming:
    """Send one streamed request and time it. A serial number leads the prompt, so no request
    finds another's prompt in the prefix cache: every prefill computes the whole prompt, as the
    profile's TTFT is read (:mod:`capacity_model.latency`)."""
    content = f"Request {next(_SERIAL)}. {prompt}"
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": output_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first: float | None = None
    last: float | None = None
    completion: int | None = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise BenchError(f"a request answered {response.status_code}: "
                             f"{(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk.get("usage"):
                completion = int(chunk["usage"]["completion_tokens"])
            for choice in chunk.get("choices", []):
                if (choice.get("delta") or {}).get("content"):
                    now = time.perf_counter()
                    first = first if first is not None else now
                    last = now
    if first is None or last is None or completion is None:
        raise BenchError("a stream ended without content or without usage (the gateway must "
                         "answer stream_options.include_usage)")
    tpot = (last - first) / (completion - 1) if completion > 1 else None
    return RequestTiming(ttft_s=first - started, tpot_s=tpot, completion_tokens=completion)


async def closed_loop(url: str, batch_size: int, rounds: int, prompt: str,
                      output_tokens: int, timeout_s: float) -> list[RequestTiming]:
    """``batch_size`` workers, each sending ``rounds`` requests one after another."""
    limits = httpx.Limits(max_connections=batch_size + 1)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:
        async def worker() -> list[RequestTiming]:
            return [await one_request(client, prompt, output_tokens) for _ in range(rounds)]

        results = await asyncio.gather(*(worker() for _ in range(batch_size)))
    return [timing for timings in results for timing in timings]


def point_of(batch_size: int, timings: Sequence[RequestTiming], *, source: str) -> DecodePoint:
    """The profile point of one batch size."""
    ttft = [t.ttft_s * 1000 for t in timings]
    tpot = [t.tpot_s * 1000 for t in timings if t.tpot_s is not None]
    if not tpot:
        raise BenchError(f"batch {batch_size}: no request generated two tokens or more")
    return DecodePoint(batch_size=batch_size,
                       ttft=Latency(percentile(ttft, 0.5), percentile(ttft, 0.99)),
                       tpot=Latency(percentile(tpot, 0.5), percentile(tpot, 0.99)),
                       status="measured", source=source)


def measure(url: str, *, key: tuple[str, str, str, str], batch_sizes: Sequence[int],
            rounds: int, prompt_tokens: int, output_tokens: int, timeout_s: float = 120.0,
            log: Any = None, target: str = "the gateway") -> DecodeProfile:
    """Run every batch size against the server at ``url`` (``target`` names it in each
    point's source); return the measured profile."""

    async def calibrated() -> str:
        async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as client:
            return await calibrate(client, prompt_tokens)

    prompt = asyncio.run(calibrated())
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    points = []
    for size in sorted(set(batch_sizes)):
        if log:
            log(f"batch {size}: {size} × {rounds} streamed requests ...")
        timings = asyncio.run(closed_loop(url, size, rounds, prompt, output_tokens, timeout_s))
        point = point_of(size, timings, source=(
            f"measured {when} by tools/decode_bench.py through {target} ({len(timings)} "
            f"streamed requests of ~{prompt_tokens} prompt tokens, max_tokens {output_tokens})"))
        if log:
            log(f"batch {size}: TTFT p50 {point.ttft.p50_ms:,.0f} ms p99 "
                f"{point.ttft.p99_ms:,.0f} ms, TPOT p50 {point.tpot.p50_ms:.1f} ms p99 "
                f"{point.tpot.p99_ms:.1f} ms")
        points.append(point)
    gpu, model, quantization, kv_cache_dtype = key
    return DecodeProfile(gpu=gpu, model=model, quantization=quantization,
                         kv_cache_dtype=kv_cache_dtype, prompt_tokens=prompt_tokens,
                         output_tokens=output_tokens, points=tuple(points))


def _key(text: str) -> tuple[str, str, str, str]:
    parts = [part.strip() for part in text.split("|")]
    if len(parts) != 4 or not all(parts):
        raise argparse.ArgumentTypeError(
            f"{text!r}: accepted: 'gpu|model|quantization|kv_cache_dtype', e.g. "
            "'NVIDIA A10G|llama-3-8b-instruct|w4a16 int4 g128|auto'")
    return parts[0], parts[1], parts[2], parts[3]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 fine, 1 the gateway misbehaved, 2 a bad argument or table."""
    parser = argparse.ArgumentParser(prog="python -m tools.decode_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8080")
    parser.add_argument("--target", default="the gateway",
                        help="what answers at --url, as each point's source names it "
                             "(default: %(default)s; e.g. \"vLLM's own server\")")
    parser.add_argument("--key", type=_key, required=True,
                        help="profile key: 'gpu|model|quantization|kv_cache_dtype' (the GPU "
                             "budget's names: MemoryPlan.gpu_model, model_name, quantization)")
    parser.add_argument("--batch-sizes", type=batch_sizes_argument, default=[1, 4, 16, 32])
    parser.add_argument("--rounds", type=int, default=3, help="requests per worker")
    parser.add_argument("--prompt-tokens", type=int, default=900)
    parser.add_argument("--output-tokens", type=int, default=190)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--write", type=Path, default=None, metavar="TABLE.json",
                        help="merge the profile into this decode-speed table")
    args = parser.parse_args(argv)
    table: DecodeSpeedTable | None = None
    if args.write is not None:
        try:
            table = parse_decode_table(args.write.read_text(encoding="utf-8"),
                                       source=str(args.write))
        except (OSError, ValueError) as error:
            print(f"decode_bench: error: {error}", file=sys.stderr)
            return 2
    try:
        profile = measure(args.url, key=args.key, batch_sizes=args.batch_sizes,
                          rounds=args.rounds, prompt_tokens=args.prompt_tokens,
                          output_tokens=args.output_tokens, timeout_s=args.timeout_s,
                          target=args.target,
                          log=lambda text: print(f"[decode-bench] {text}", file=sys.stderr))
    except (BenchError, httpx.HTTPError) as error:
        print(f"decode_bench: FAIL: {error}", file=sys.stderr)
        return 1
    if table is None or args.write is None:
        print(json.dumps(profile.to_dict(), indent=2, ensure_ascii=False))
        return 0
    args.write.write_text(table.with_profile(profile).to_json(), encoding="utf-8")
    print(f"[decode-bench] wrote {profile.describe()} ({len(profile.points)} points, measured) "
          f"to {args.write}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
