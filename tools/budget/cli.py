"""``python -m tools.budget``: print a plan, compare static and paged KV, list instance types.

A thin operator shell over the pure :mod:`gpu_budget`: argument parsing, file reading and
printing. ``env --env ENV`` prints the plan an environment's LLM endpoint is deployed with (the
one its settings produced when they loaded; ``make budget ENV=prod``). Exit codes: 0 fine, 1 the
configuration does not fit (the refusal paragraph is printed), 2 a bad argument or configuration
(one line each).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from gpu_budget.engine_args import BLOCK_SIZES
from gpu_budget.instances import GIB, INSTANCE_CATALOG
from gpu_budget.kv import KV_CACHE_DTYPES
from gpu_budget.lengths import SEED_EXAMPLE_REQUEST_TOKENS
from gpu_budget.planner import BudgetError, MemoryPlan, plan
from gpu_budget.static_paged import static_vs_paged
from gpu_budget.weights import QUANTIZATION_CHOICES
from stacks.settings import SettingsError, load_environment
from tools.budget.report import format_plan, format_static_vs_paged

PROG = "tools.budget"


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument on one line (no usage dump) and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    return value


def _token_list(text: str) -> list[int]:
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        values.append(_positive_int(part))
    if not values:
        raise argparse.ArgumentTypeError("no request lengths given")
    return values


def _add_sizing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, type=Path,
                        help="path to the model's Hugging Face config.json (config/models/*.json)")
    parser.add_argument("--quantization", default=None, choices=(*QUANTIZATION_CHOICES, "none"),
                        help="checkpoint format (default: the config's quantization_config, "
                             "else bf16)")
    parser.add_argument("--instance", required=True,
                        help="SageMaker instance type, e.g. ml.g5.xlarge")
    parser.add_argument("--max-model-len", required=True, type=_positive_int,
                        help="context length in tokens (prompt + generated)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=tuple(KV_CACHE_DTYPES))
    parser.add_argument("--tensor-parallel-size", type=_positive_int, default=1)
    parser.add_argument("--block-size", type=int, default=16, choices=BLOCK_SIZES)
    parser.add_argument("--gpu-memory-utilization", type=_fraction, default=None,
                        help="fraction of GPU memory for vLLM (default: the per-SKU rule)")
    parser.add_argument("--max-num-seqs", type=_positive_int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=_positive_int, default=None)
    parser.add_argument("--max-loras", type=_non_negative_int, default=0,
                        help="LoRA adapter slots on the GPU (0 = LoRA off)")
    parser.add_argument("--max-lora-rank", type=_non_negative_int, default=0)
    parser.add_argument("--max-cpu-loras", type=_non_negative_int, default=None)
    lengths = parser.add_mutually_exclusive_group()
    lengths.add_argument("--request-lengths", type=_token_list, default=None,
                         help="comma-separated request lengths in tokens (prompt + output)")
    lengths.add_argument("--request-lengths-file", type=Path, default=None,
                         help="file with one request length per line ('#' starts a comment)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def build_parser() -> argparse.ArgumentParser:
    """The CLI's argument parser."""
    parser = _OneLineParser(prog=PROG, description="Size vLLM's GPU memory and refuse what "
                                                   "cannot fit.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    plan_parser = sub.add_parser("plan", help="print the memory plan for one configuration")
    _add_sizing_arguments(plan_parser)
    plan_parser.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                             help="also draw the memory stack and concurrency vs context length")
    compare = sub.add_parser("static-vs-paged",
                             help="KV waste and concurrency: static pre-allocation vs pages")
    _add_sizing_arguments(compare)
    instances = sub.add_parser("instances", help="list the instance catalog")
    instances.add_argument("--json", action="store_true")
    environment = sub.add_parser("env", help="print the memory plan of an environment's LLM "
                                 "endpoint (config/<env>.yaml)")
    environment.add_argument("--env", required=True, help="environment (config/<env>.yaml)")
    environment.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def _read_lengths_file(path: Path) -> list[int]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(
            f"cannot read --request-lengths-file {str(path)!r}: {exc.strerror}"
        ) from None
    values: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        content = line.split("#", 1)[0].strip()
        if not content:
            continue
        try:
            value = int(content)
        except ValueError:
            raise ValueError(
                f"{path}:{number}: {content!r} is not an integer token count"
            ) from None
        if value <= 0:
            raise ValueError(f"{path}:{number}: request length must be positive, got {value}")
        values.append(value)
    if not values:
        raise ValueError(f"--request-lengths-file {str(path)!r} holds no request lengths")
    return values


def _plan_from_args(args: argparse.Namespace, lengths: Sequence[int] | None) -> MemoryPlan:
    return plan(
        str(args.model),
        quantization=args.quantization,
        instance=args.instance,
        max_model_len=args.max_model_len,
        kv_cache_dtype=args.kv_cache_dtype,
        tensor_parallel_size=args.tensor_parallel_size,
        block_size=args.block_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        max_cpu_loras=args.max_cpu_loras,
        request_lengths=lengths,
    )


def _lengths_from_args(args: argparse.Namespace) -> list[int] | None:
    if args.request_lengths_file is not None:
        return _read_lengths_file(args.request_lengths_file)
    lengths: list[int] | None = args.request_lengths
    return lengths


def _list_instances(as_json: bool) -> str:
    if as_json:
        return json.dumps([inst.to_dict() for inst in INSTANCE_CATALOG.values()], indent=2)
    lines = [f"{'instance':<18} {'accelerators':<32} {'GiB each':>8} {'util':>5} "
             f"{'USD/h':>8}  basis"]
    for inst in INSTANCE_CATALOG.values():
        util = f"{inst.default_gpu_memory_utilization:.2f}" if inst.gpu_count else "-"
        accel = f"{inst.accelerator_count} x {inst.accelerator_model}"
        lines.append(
            f"{inst.name:<18} {accel:<32} {inst.memory_per_accelerator_bytes / GIB:>8.1f} "
            f"{util:>5} {inst.on_demand_usd_per_hour:>8.3f}  {inst.price_basis}"
        )
    lines.append("Prices: approximate ap-northeast-1 on-demand (us-east-1 list x 1.35); see "
                 "gpu_budget/instances.py.")
    return "\n".join(lines)


def _environment_plan(name: str, *, as_json: bool) -> int:
    """``env``: the plan ``config/<name>.yaml``'s LLM endpoint gets (made when it loaded)."""
    try:
        environment = load_environment(name)
    except SettingsError as error:
        for line in str(error).splitlines():
            print(f"{PROG}: error: {line}", file=sys.stderr)
        return 2
    memory_plan = environment.plans.llm_memory
    print(memory_plan.to_json() if as_json else format_plan(memory_plan))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "instances":
        print(_list_instances(args.json))
        return 0
    if args.command == "env":
        return _environment_plan(args.env, as_json=args.json)
    if args.command == "plan" and args.plot is not None and args.plot.suffix.lower() != ".png":
        parser.error(f"--plot must name a .png file, got {str(args.plot)!r}")
    try:
        lengths = _lengths_from_args(args)
        if args.command == "static-vs-paged" and lengths is None:
            lengths = list(SEED_EXAMPLE_REQUEST_TOKENS)
        memory_plan = _plan_from_args(args, lengths)
        if args.command == "static-vs-paged":
            assert lengths is not None
            comparison = static_vs_paged(memory_plan, lengths)
            print(json.dumps(comparison.to_dict(), indent=2) if args.json
                  else format_static_vs_paged(comparison))
            return 0
    except BudgetError as exc:
        if exc.kind == "invalid-setting":
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
        print(f"{PROG}: refused: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(memory_plan.to_json() if args.json else format_plan(memory_plan))
    if args.plot is not None:
        from tools.budget.plotting import plot_plan

        written = plot_plan(memory_plan, args.plot)
        print(f"plot written to {written}", file=sys.stderr)
    return 0
