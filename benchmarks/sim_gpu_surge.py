"""The GPU host's surge and burst (benchmarks/gpu_surge.py) on the test simulator shaped like the
H200 run, so that admission's behaviour on a sequence-bound GPU engine can be measured here.

On the H200 (docs/gateway.md#surges, eighth round: vLLM 0.33, an 8B shape, eager, one rank-8
adapter, 64 sequences, 2,048-token steps, a pool of 56,569 blocks that never filled) every answer
held its sequence for 64 tokens of about 66 ms and a full prefill step took about 150 ms. The
simulator (:mod:`tests.support.sim_engine`: continuous batching first come first served, chunked
prefill within the step's token budget, a step costing ``SIM_STEP_TIME_S`` + ``SIM_TOKEN_TIME_S``
per batched token) is given that shape: 60 ms + 40 us a token (a decode step of 64 streams 63 ms,
a full prefill step 142 ms), answers that never stop early, the same pool and limits. The gateway
runs on it unchanged (``tests/support/sim_serve.py``), with the kit's GATEWAY_* settings; the
client is gpu_surge.py's (the short 3-turn chats, streamed, naming the adapter), at the rate vLLM's
server sustained on the H200 (10.96 requests a second) unless ``--rate`` says otherwise.

Its figures are the gateway's alone (no vLLM server runs on the simulator); the H200's own,
before the current code, were 304 good of 310 admitted in the surge and 15 of 512 in the burst,
where vLLM's server without a cap started 64 within the SLO. Progress on stderr, the figures as
JSON on stdout.

    python benchmarks/sim_gpu_surge.py [--rate 10.96] [--burst 512] [--duration-s 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import engine_servers
import gpu_surge
from engine_servers import REPO, AdapterFixture, ServerProcess, tiny_model

from tests.support.network import free_port

H200_RATE = 10.96
"""Requests a second vLLM's server sustained on the H200 (a closed loop of 64, 10 s)."""
SHAPE = {
    "ENGINE_MAX_NUM_SEQS": "64", "ENGINE_MAX_NUM_BATCHED_TOKENS": "2048",
    "ENGINE_NUM_GPU_BLOCKS": "56569", "ENGINE_BLOCK_SIZE": "16", "ENGINE_MAX_MODEL_LEN": "1024",
    "ENGINE_ENABLE_LORA": "true", "ENGINE_MAX_LORAS": "1", "ENGINE_MAX_LORA_RANK": "8",
    "ENGINE_ENABLE_PREFIX_CACHING": "true", "ENGINE_DTYPE": "bfloat16",
    "GATEWAY_BUCKET_CAPS": "S=64,M=64,L=64,XL=64", "GATEWAY_METRICS_ENDPOINT_NAME": "sim-h200",
    "SIM_STEP_TIME_S": "0.06", "SIM_TOKEN_TIME_S": "0.00004", "SIM_EOS_PROBABILITY": "0",
}
"""The H200 run's engine limits and the simulator's step cost fitted to its decode step and its
prefill step (the simulator's knobs are SIM_* variables the gateway never reads)."""


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=H200_RATE, help="surge base rate (req/s)")
    parser.add_argument("--burst", type=int, default=512, help="requests sent at once after it")
    parser.add_argument("--duration-s", type=float, default=20.0, help="seconds of the surge")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    model_dir = tiny_model(adapters=[AdapterFixture("manga_domain", rank=8, seed=1)])
    env = {"GATEWAY_MODEL_DIR": str(model_dir), "GATEWAY_SERVED_MODEL_NAME": "smoke-base",
           "GATEWAY_ADAPTERS": "smoke=manga_domain",
           "GATEWAY_ROUTING_TABLE": "recommendation=smoke", "GATEWAY_LOCALE_ROUTES": "",
           **SHAPE}
    port = free_port()
    command = [sys.executable, str(REPO / "tests" / "support" / "sim_serve.py"), "--engine",
               "sim", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    with tempfile.TemporaryDirectory(prefix="sim-h200-") as log_dir:
        print("starting the gateway on the H200-shaped simulator ...", file=sys.stderr,
              flush=True)
        server = ServerProcess(command, port=port, env=env, log_dir=Path(log_dir), name="sim")
        try:
            server.wait_healthy("/ping", timeout_s=engine_servers.STARTUP_TIMEOUT_S)
            result: dict[str, Any] = gpu_surge.run(gpu_surge.parse([
                "--url", server.url, "--path", "/invocations", "--model", "smoke",
                "--label", "gateway-sim-h200", "--rate", str(args.rate), "--multiple", "2",
                "--duration-s", str(args.duration_s), "--burst", str(args.burst)]))
            import httpx
            result["admission_after"] = httpx.get(server.url + "/ping", timeout=5).json().get(
                "admission")
        finally:
            server.stop()
    print(json.dumps(result, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
