"""The GPU smoke test's Python steps (tools/gpu_smoke.sh runs them; ``make gpu-smoke``).

    adapter MODEL_DIR ADAPTER_DIR     a random rank-8 PEFT LoRA (q_proj, v_proj) from config.json's
                                      shapes alone: no weights needed (LOAD_FORMAT=dummy hosts)
    cold --url URL [--requests 10] [--interval 1]
                                      short streamed chats INTERVAL s apart right after /ping turned
                                      200: each status and time to first token, "N/10 served"
    compare GATEWAY.json VLLM.json    two decode_bench profiles side by side: TTFT and TPOT p50,
                                      gateway ÷ vLLM
    write --profile P.json --table T.json
                                      merge a decode_bench profile into a decode-speed table

Runs in the smoke test's environment (vLLM's, with the gateway's requirements). vLLM's own
server's flags for the comparison come from the gateway itself (``serve --vllm-server-args``):
nothing here imports the container's package.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LORA_RANK = 8


def write_adapter(model_dir: Path, adapter_dir: Path, *, rank: int = LORA_RANK,
                  seed: int = 0) -> list[str]:
    """A PEFT LoRA adapter of ``rank`` on every layer's q_proj and v_proj, shaped from
    ``model_dir/config.json``; the tensor names written."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    outputs = {"q_proj": heads * head_dim, "v_proj": kv_heads * head_dim}
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(int(config["num_hidden_layers"])):
        for module, out_features in outputs.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(
                rank, hidden, generator=generator, dtype=torch.float32).to(torch.bfloat16) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(
                out_features, rank, generator=generator,
                dtype=torch.float32).to(torch.bfloat16) * 0.01
    adapter_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(adapter_dir / "adapter_model.safetensors"))
    (adapter_dir / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
        "lora_dropout": 0.0, "bias": "none", "target_modules": sorted(outputs),
        "base_model_name_or_path": str(model_dir), "fan_in_fan_out": False,
        "inference_mode": True}, indent=2), encoding="utf-8")
    return sorted(tensors)


def first_token_s(url: str, index: int, timeout_s: float = 60.0) -> tuple[int, float | None]:
    """One short streamed chat: (status, seconds to its first content chunk, None if none)."""
    import httpx

    body = {"messages": [{"role": "user", "content": f"({index}) Recommend one manga like "
                                                     "Frieren."}],
            "max_tokens": 16, "stream": True}
    started = time.monotonic()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body,
                      timeout=timeout_s) as response:
        if response.status_code != 200:
            response.read()
            return response.status_code, None
        for line in response.iter_lines():
            if line.startswith("data: {"):
                return 200, time.monotonic() - started
    return 200, None


def cold_start(url: str, *, requests: int, interval_s: float) -> int:
    """The cold-start report (module docstring); 0 when every request was served."""
    served = 0
    for index in range(requests):
        started = time.monotonic()
        status, ttft = first_token_s(url, index)
        served += status == 200
        shown = "-" if ttft is None else f"{ttft * 1000:.0f} ms"
        print(f"[gpu-smoke] cold start request {index + 1}/{requests}: {status}, TTFT {shown}",
              file=sys.stderr)
        time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    print(f"[gpu-smoke] cold start: {served}/{requests} served", file=sys.stderr)
    return 0 if served == requests else 1


def comparison(gateway: dict[str, Any], vllm: dict[str, Any]) -> list[str]:
    """Rows of TTFT and TPOT p50 for both servers at each batch size, with gateway ÷ vLLM."""
    rows = ["batch | gateway TTFT p50 ms | vLLM TTFT p50 ms | ratio | gateway TPOT p50 ms | "
            "vLLM TPOT p50 ms | ratio"]
    theirs = {point["batch_size"]: point for point in vllm["points"]}
    for point in gateway["points"]:
        other = theirs.get(point["batch_size"])
        if other is None:
            continue
        cells = [str(point["batch_size"])]
        for metric in ("ttft_ms", "tpot_ms"):
            ours, base = point[metric]["p50"], other[metric]["p50"]
            cells += [f"{ours:.1f}", f"{base:.1f}", f"{ours / base:.2f}x" if base else "-"]
        rows.append(" | ".join(cells))
    return rows


def main(argv: Sequence[str]) -> int:
    """Run one step (module docstring); its exit status."""
    parser = argparse.ArgumentParser(prog="gpu_smoke_report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = parser.add_subparsers(dest="step", required=True)
    adapter = steps.add_parser("adapter")
    adapter.add_argument("model_dir", type=Path)
    adapter.add_argument("adapter_dir", type=Path)
    cold = steps.add_parser("cold")
    cold.add_argument("--url", required=True)
    cold.add_argument("--requests", type=int, default=10)
    cold.add_argument("--interval", type=float, default=1.0)
    compare = steps.add_parser("compare")
    compare.add_argument("gateway", type=Path)
    compare.add_argument("vllm", type=Path)
    write = steps.add_parser("write")
    write.add_argument("--profile", type=Path, required=True)
    write.add_argument("--table", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.step == "adapter":
        names = write_adapter(args.model_dir, args.adapter_dir)
        print(f"[gpu-smoke] wrote {len(names)} LoRA tensors to {args.adapter_dir}",
              file=sys.stderr)
        return 0
    if args.step == "cold":
        return cold_start(args.url, requests=args.requests, interval_s=args.interval)
    if args.step == "compare":
        rows = comparison(json.loads(args.gateway.read_text(encoding="utf-8")),
                          json.loads(args.vllm.read_text(encoding="utf-8")))
        print("\n".join(rows))
        return 0
    return write_profile(args.profile, args.table)


def write_profile(profile_path: Path, table_path: Path) -> int:
    """Merge a decode_bench profile (its JSON) into a decode-speed table, replacing the profile
    of the same key, both read and checked as the capacity model reads them."""
    from capacity_model.decode_speed import parse_decode_table, parse_profile

    profile = parse_profile(json.loads(profile_path.read_text(encoding="utf-8")),
                            source=str(profile_path))
    table = parse_decode_table(table_path.read_text(encoding="utf-8"), source=str(table_path))
    table_path.write_text(table.with_profile(profile).to_json(), encoding="utf-8")
    print(f"[gpu-smoke] wrote the profile of {' | '.join(profile.key)} to {table_path}",
          file=sys.stderr)
    return 0
