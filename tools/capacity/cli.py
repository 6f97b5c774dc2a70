"""``python -m tools.capacity``: print an environment's capacity plan, or estimate a decode profile.

A thin operator shell over the pure :mod:`capacity_model`: it loads ``config/<env>.yaml`` through
:mod:`stacks.settings` (the same validated settings and plans the stacks get) and prints what
:func:`capacity_model.llm_capacity` derived. Exit codes: 0 fine, 2 a bad argument or
configuration (one line per problem). ``make capacity ENV=prod`` runs ``plan`` and ``pools``.

    python -m tools.capacity plan --env prod
    python -m tools.capacity pools --env prod
    python -m tools.capacity estimate --env prod --prompt-tokens 900 --output-tokens 190 \
        --kv-cache-dtype fp8_e5m2 --write

``estimate`` takes the GPU's rates from the decode-speed table (``rates``, at ``--scenario``);
each flag overrides one of them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from capacity_model import LlmCapacity
from capacity_model.decode_speed import DecodeSpeedTable, DecodeTableError, parse_decode_table
from capacity_model.pools import evaluate_pools, seed_002_options
from capacity_model.price import PriceComparison
from capacity_model.price_snapshot import parse_snapshot
from capacity_model.rates import SCENARIOS
from capacity_model.report import format_capacity, format_pools, format_ranges, plan_price
from capacity_model.roofline import RooflineInputs, estimate_profile
from capacity_model.routing_plan import compare, format_comparison
from gpu_budget import MemoryPlan
from stacks.settings import REPO_ROOT, Environment, SettingsError, load_environment
from tools.capacity.arguments import batch_sizes_argument, positive

PROG = "tools.capacity"
PRICE_SNAPSHOT = REPO_ROOT / "config" / "prices.json"
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192)


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser."""
    parser = _OneLineParser(prog=PROG, description="The capacity model: GPU budget → fleet.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    plan = sub.add_parser("plan", help="print an environment's LLM capacity plan")
    plan.add_argument("--env", required=True, help="environment (config/<env>.yaml)")
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pools = sub.add_parser("pools", help="separate long/short pools against one pool, priced "
                           "(docs/design-decisions.md#separate-pools)")
    pools.add_argument("--env", required=True, help="environment (config/<env>.yaml)")
    pools.add_argument("--faster", default="ml.g6e.xlarge",
                       help="the larger GPU instance an option moves pools to (default: "
                       "%(default)s)")
    routing = sub.add_parser("routing", help="least-outstanding + sessions against PREFIX_AWARE "
                             "on the busiest hour and a release surge (docs/scaling.md)")
    routing.add_argument("--env", required=True, help="environment (config/<env>.yaml)")
    estimate = sub.add_parser(
        "estimate", help="estimate a decode profile (roofline) for an environment's GPU and model")
    estimate.add_argument("--env", required=True)
    estimate.add_argument("--kv-cache-dtype", default=None,
                          help="plan this KV dtype instead of the environment's")
    estimate.add_argument("--instance", default=None,
                          help="plan this instance type instead of the environment's")
    estimate.add_argument("--scenario", choices=SCENARIOS, default="central",
                          help="which end of the rates' ranges (default: %(default)s)")
    estimate.add_argument("--memory-bandwidth-gb-s", type=positive(float), default=None)
    estimate.add_argument("--bandwidth-efficiency", type=positive(float), default=None)
    estimate.add_argument("--prefill-tokens-per-s", type=positive(float), default=None)
    estimate.add_argument("--decode-compute-tokens-per-s", type=positive(float), default=None)
    estimate.add_argument("--prompt-tokens", type=positive(int), required=True)
    estimate.add_argument("--cached-prompt-tokens", type=int, default=0,
                          help="prompt tokens the prefix cache serves (default: 0)")
    estimate.add_argument("--output-tokens", type=positive(int), required=True)
    estimate.add_argument("--ttft-p99-over-p50", type=positive(float), default=1.15,
                          help="first-token jitter of an unloaded engine (queueing adds its "
                          "own tail; default: %(default)s, measured on vLLM's CPU build by "
                          "benchmarks/capacity_check.py)")
    estimate.add_argument("--tpot-p99-over-p50", type=positive(float), default=1.08,
                          help="per-token jitter of an unloaded engine (default: %(default)s, "
                          "measured likewise)")
    estimate.add_argument("--batch-sizes", type=batch_sizes_argument,
                          default=list(DEFAULT_BATCH_SIZES))
    estimate.add_argument("--write", action="store_true",
                          help="write the profile into the environment's decode-speed table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        environment = load_environment(args.env)
    except SettingsError as error:
        for line in str(error).splitlines():
            print(f"{PROG}: error: {line}", file=sys.stderr)
        return 2
    settings, capacity = environment.settings.llm, environment.plans.llm_capacity
    if args.command == "pools":
        options = evaluate_pools(capacity, settings.memory_plan, settings.decode_speed_table(),
                                 seed_002_options(settings.instance_type, args.faster))
        print(format_pools(options))
        return 0
    if args.command == "routing":
        print("\n".join(format_comparison(compare(capacity))))
        return 0
    if args.command == "plan":
        if args.json:
            print(json.dumps({"instance": capacity.instance.to_dict(),
                              "fleet": capacity.fleet.to_dict(),
                              "gateway_environment": capacity.gateway_environment()},
                             indent=2, ensure_ascii=False))
        else:
            print(format_capacity(capacity, snapshot_price(capacity)))
            print("\n".join(format_ranges(range_rows(environment))))
            print(cost_allocation_line(environment.settings.tags))
        return 0
    return _estimate(args, settings.capacity.decode_speed_file,
                     settings.memory_plan(kv_cache_dtype=args.kv_cache_dtype,
                                          instance=args.instance))


def snapshot_price(capacity: LlmCapacity) -> PriceComparison | None:
    """The plan priced at ``config/prices.json``'s rate for its instance, when the snapshot
    holds one (None: the catalog's derived rate, which the report names)."""
    snapshot = parse_snapshot(json.loads(PRICE_SNAPSHOT.read_text(encoding="utf-8")))
    rate = snapshot.rate_of(capacity.memory_plan.instance_type)
    return None if rate is None else plan_price(capacity, rate, snapshot.basis())


def range_rows(environment: Environment) -> list[tuple[str, LlmCapacity]]:
    """The plan re-derived at each end of the LoRA factor's and the decode efficiency's ranges
    (the table's rates for the plan's GPU; empty when it has none)."""
    settings = environment.settings.llm
    capacity = environment.plans.llm_capacity
    rates = capacity.rates
    if rates is None:
        return []
    scenario = settings.capacity.rates.scenario
    rows: list[tuple[str, LlmCapacity]] = [("as planned", capacity)]
    if rates.lora_step_factor is not None and capacity.memory_plan.max_loras > 0:
        for end, value in (("low", rates.lora_step_factor.low),
                           ("high", rates.lora_step_factor.high)):
            rows.append((f"LoRA step × {value:g} ({end})",
                         settings.capacity_plan(capacity.memory_plan,
                                                what_if={"lora_step_factor": value})))
    efficiency = rates.decode_compute_efficiency or rates.compute_efficiency
    for end, value in (("low", efficiency.low), ("high", efficiency.high)):
        if value != efficiency.pick(scenario):
            rows.append((f"decode efficiency {value:g} ({end})",
                         settings.capacity_plan(capacity.memory_plan,
                                                what_if={"decode_compute_efficiency": value})))
    return rows


def cost_allocation_line(tags: dict[str, str]) -> str:
    """Which tags to activate as cost-allocation tags, so that Cost Explorer can confirm the
    saving per endpoint and environment (the README's first deploy says when)."""
    keys = sorted(tags)
    status = " ".join(f"TagKey={key},Status=Active" for key in keys)
    return ("Cost allocation: activate the stage's tags "
            f"{', '.join(keys)} once per payer account (aws ce update-cost-allocation-tags-status "
            f"--cost-allocation-tags-status {status}), then group by them in Cost Explorer")


def _estimate(args: argparse.Namespace, decode_speed_file: str, plan: MemoryPlan) -> int:
    """``estimate``: print the roofline's decode profile, or write it into the table."""
    path = REPO_ROOT / decode_speed_file
    table = parse_decode_table(path.read_text(encoding="utf-8"), source=str(path))
    try:
        inputs = _estimate_inputs(args, table, plan)
    except (ValueError, DecodeTableError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    profile = estimate_profile(gpu=plan.gpu_model, model=plan.model_name,
                               quantization=plan.quantization,
                               kv_cache_dtype=plan.kv_cache_dtype, inputs=inputs,
                               batch_sizes=args.batch_sizes)
    if not args.write:
        print(json.dumps(profile.to_dict(), indent=2, ensure_ascii=False))
        return 0
    path.write_text(table.with_profile(profile).to_json(), encoding="utf-8")
    print(f"wrote {profile.describe()} ({len(profile.points)} points, assumption) to {path}",
          file=sys.stderr)
    return 0


def _estimate_inputs(args: argparse.Namespace, table: DecodeSpeedTable,
                     plan: MemoryPlan) -> RooflineInputs:
    """The roofline's inputs: the table's rates for the plan's GPU at ``--scenario``, each
    overridden by its flag (no rates are needed when every rate flag is given)."""
    rate_flags = (args.memory_bandwidth_gb_s, args.bandwidth_efficiency,
                  args.prefill_tokens_per_s, args.decode_compute_tokens_per_s)
    if all(flag is not None for flag in rate_flags):
        bandwidth, efficiency, prefill, compute = rate_flags
    else:
        rates = table.rates_for(plan.gpu_model, plan.model_name, plan.quantization)
        bandwidth = _or(args.memory_bandwidth_gb_s, rates.memory_bandwidth_gb_s)
        efficiency = _or(args.bandwidth_efficiency, rates.bandwidth_efficiency.pick(
            args.scenario))
        prefill = _or(args.prefill_tokens_per_s, rates.prefill_tokens_per_s(args.scenario))
        compute = _or(args.decode_compute_tokens_per_s,
                      rates.decode_compute_tokens_per_s(args.scenario))
    return RooflineInputs(
        weights_bytes=plan.weights_bytes, kv_bytes_per_token=plan.kv_bytes_per_token,
        memory_bandwidth_gb_s=bandwidth, bandwidth_efficiency=efficiency,
        prefill_tokens_per_s=round(prefill, 1), decode_compute_tokens_per_s=round(compute, 1),
        prompt_tokens=args.prompt_tokens, cached_prompt_tokens=args.cached_prompt_tokens,
        output_tokens=args.output_tokens, ttft_p99_over_p50=args.ttft_p99_over_p50,
        tpot_p99_over_p50=args.tpot_p99_over_p50,
        max_num_batched_tokens=plan.max_num_batched_tokens)


def _or(flag: float | None, default: float) -> float:
    return default if flag is None else flag
