"""The sustained surge and the one-shot burst of admission_surge.py / admission_burst.py against a
server that is already running (a GPU host, where this project cannot start the servers itself).

One server per run, named by ``--label``; run it once against the gateway and once against vLLM's
own server on the same engine and model, and compare the two JSON files. In order:

1. the sustainable rate (unless ``--rate`` gives it): completed requests per second of a closed
   loop of ``--clients`` clients (the engine's ``max_num_seqs``: on a GPU the 16 of the CPU
   protocol leave most of the batch empty) for ``--closed-s`` seconds;
2. the sustained surge: Poisson arrivals at ``--multiple`` × that rate for ``--duration-s``
   (``--duration-s 0``: none, e.g. for a server without admission, which only the burst compares);
3. the burst: ``--burst`` requests at once.

Each request is admission_common's distinct 3-turn chat, streamed, ``--model`` naming the
adapter; "good" = 200, not a fallback, first chunk within ``--slo-s`` of leaving the client.
Progress on stderr; the figures as one JSON document on stdout (and ``--json``).

    python benchmarks/gpu_surge.py --url http://127.0.0.1:8080 --path /invocations \\
        --model smoke --label gateway --multiple 2 --duration-s 20 --burst 512
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import admission_common as common
from admission_surge import arrivals, closed_loop, open_loop


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--url", required=True, help="the running server, e.g. http://127.0.0.1:8080")
    add("--path", default="/v1/chat/completions", help="/invocations for the gateway")
    add("--model", default=common.MODEL_NAME, help="the adapter every request names")
    add("--label", required=True, help="what the server is (gateway, vllm-q30000 ...)")
    add("--rate", type=float, help="the sustainable rate (requests/s); measured when absent")
    add("--clients", type=int, default=64, help="closed-loop clients for the rate")
    add("--closed-s", type=float, default=10.0, help="seconds of the closed loop")
    add("--multiple", type=float, default=2.0, help="surge arrivals as a multiple of the rate")
    add("--duration-s", type=float, default=20.0,
        help="seconds of surge arrivals (0: no surge)")
    add("--burst", type=int, default=0, help="requests sent at once after the surge (0: none)")
    add("--slo-s", type=float, default=2.0, help="time-to-first-token SLO")
    add("--seed", type=int, default=7, help="fixes the arrival times and the chats")
    add("--json", type=Path, help="also write the figures here")
    return parser.parse_args(argv)


def summary(outcomes: Sequence[common.Outcome], slo_ms: float) -> dict[str, Any]:
    """The run's figures (admission_common.figures) with its client lag."""
    figures = asdict(common.figures(outcomes, slo_ms))
    lags = [outcome.lag_ms for outcome in outcomes]
    figures["client_lag_p99_ms"] = common.percentile(lags, 0.99)
    return figures


async def burst(url: str, path: str, size: int, first_seed: int) -> list[common.Outcome]:
    """``size`` distinct chats at once on the lean client."""
    async with common.StreamClient(url) as http:
        return list(await asyncio.gather(*(http.chat(path, common.chat(first_seed + index))
                                           for index in range(size))))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The three steps (see the module docstring); their figures."""
    common.MODEL_NAME = args.model
    common.raise_open_files_limit()
    slo_ms = args.slo_s * 1000
    result: dict[str, Any] = {"label": args.label, "url": args.url, "model": args.model}
    rate = args.rate
    if rate is None:
        rate = asyncio.run(closed_loop(args.url, args.path, common.chat, 10_000_000,
                                       clients=args.clients, seconds=args.closed_s))
        print(f"[{args.label}] sustainable rate {rate:.2f}/s ({args.clients} clients, "
              f"{args.closed_s:g} s)", file=sys.stderr, flush=True)
    result["rate_per_s"] = rate
    if args.duration_s > 0:
        times = arrivals(args.multiple * rate, args.duration_s, args.seed)
        schedule = [(moment, common.chat(20_000_000 + index))
                    for index, moment in enumerate(times)]
        started = time.perf_counter()
        outcomes = asyncio.run(open_loop(args.url, args.path, schedule))
        result["surge"] = {"multiple": args.multiple, "duration_s": args.duration_s,
                           "seconds": round(time.perf_counter() - started, 1),
                           **summary(outcomes, slo_ms)}
        print(f"[{args.label}] surge {args.multiple:g}x: {json.dumps(result['surge'])}",
              file=sys.stderr, flush=True)
    if args.burst:
        time.sleep(3.0)  # the last answers (the closed loop's or the surge's) drain
        outcomes = asyncio.run(burst(args.url, args.path, args.burst, 30_000_000))
        starts = [o.ttft_ms for o in outcomes if o.status == 200 and not o.fallback]
        result["burst"] = {"size": args.burst, **summary(outcomes, slo_ms),
                           "near_slo": asdict(common.near_slo(starts, slo_ms))}
        print(f"[{args.label}] burst {args.burst}: {json.dumps(result['burst'])}",
              file=sys.stderr, flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    result = run(args)
    text = json.dumps(result, indent=1, default=float)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
