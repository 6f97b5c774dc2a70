"""Run the gateway locally on the simulated engine (what ``make local`` runs).

Builds the demo model directory (a byte-level BPE tokenizer trained on a manga corpus, no
downloads) into ``.cache/llm-demo-model`` if it is not there, prints how to talk to the gateway
with curl and the openai client, then replaces itself with the gateway's ``serve`` with the
simulated engine registered (``tests/support/sim_serve.py --engine sim``). The simulator and the
demo model are test support and never ship in the image. Test mode is on, so
``POST /admin/engine/oom`` kills the simulated engine to show the fallback and recovery.

    python -m tools.local_gateway [--host 127.0.0.1] [--port 8080] [--model-dir DIR]

It listens on 127.0.0.1 unless told otherwise (``--host``, or ``HOST=`` through ``make local``):
a development server in test mode (``POST /admin/engine/oom`` kills its engine) is not for the
network.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from serving_contract.environment import (
    GATEWAY_METRICS_ENDPOINT_NAME,
    GATEWAY_METRICS_INTERVAL_S,
    GATEWAY_MODEL_DIR,
    GATEWAY_TEST_MODE,
)
from tests.support.demo_model import write_model_dir

REPO = Path(__file__).resolve().parent.parent
SIM_SERVE = REPO / "tests" / "support" / "sim_serve.py"
LOCAL_DEFAULTS = {
    GATEWAY_TEST_MODE: "true",
    GATEWAY_METRICS_ENDPOINT_NAME: "local",
    GATEWAY_METRICS_INTERVAL_S: "30",
    "SIM_STEP_TIME_S": "0.02",  # ~50 tokens/s per sequence: streaming is visible
    "SIM_EOS_PROBABILITY": "0.03",
}


DEFAULT_HOST = "127.0.0.1"


def instructions(host: str, port: int) -> str:
    """How to talk to the local gateway: curl, the openai client, the OOM injection."""
    shown = "localhost" if host in (DEFAULT_HOST, "0.0.0.0", "::") else host
    url = f"http://{shown}:{port}"
    return f"""
MangaAssist gateway on the simulated engine: {url}  (Ctrl-C to stop)

  /ping (503 warming_up for a moment, then 200):
    curl -s {url}/ping

  a chat completion routed by intent and locale (-> the manga-ja adapter):
    curl -s {url}/invocations -H 'content-type: application/json' -d '{{
      "messages": [{{"role": "user", "content": "鬼滅の刃に似たマンガを教えてください"}}],
      "max_tokens": 32, "mangaassist": {{"intent": "recommendation", "locale": "ja-JP"}}}}'

  streaming (Server-Sent Events):
    curl -sN {url}/v1/chat/completions -H 'content-type: application/json' -d '{{
      "model": "manga", "stream": true, "max_tokens": 32,
      "messages": [{{"role": "user", "content": "Recommend manga like Naruto"}}]}}'

  the openai client:
    python -c "import openai; c = openai.OpenAI(base_url='{url}/v1', api_key='x'); \\
print(c.chat.completions.create(model='manga', max_tokens=16, \\
messages=[{{'role': 'user', 'content': 'Is One Piece volume 1 in English?'}}]).choices[0].message)"

  kill the engine with a simulated CUDA OOM (test mode), then watch /ping and the fallback:
    curl -s -X POST {url}/admin/engine/oom

  the OpenAPI schema: {url}/docs
  stdout below: one JSON line per request (CloudWatch EMF) and gateway events.
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: ``--host`` (127.0.0.1), ``--port`` ($PORT or 8080), ``--model-dir``."""
    parser = argparse.ArgumentParser(description="Run the gateway on the simulated engine.")
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"address to listen on (default {DEFAULT_HOST}; 0.0.0.0: every "
                             "interface)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8080")))
    parser.add_argument("--model-dir", type=Path, default=REPO / ".cache" / "llm-demo-model")
    return parser.parse_args(argv)


def serve_command(host: str, port: int) -> list[str]:
    """The gateway's ``serve`` with the simulator, listening on ``host``:``port``."""
    return [sys.executable, str(SIM_SERVE), "--engine", "sim", "--host", host, "--port", str(port)]


def main() -> int:
    """Build the demo model if needed, print the instructions, exec the gateway."""
    args = parse_args()
    if not (args.model_dir / "tokenizer.json").is_file():
        print(f"building the demo model directory in {args.model_dir} ...", flush=True)
        write_model_dir(args.model_dir)
    print(instructions(args.host, args.port), flush=True)
    env = {**LOCAL_DEFAULTS, **os.environ, GATEWAY_MODEL_DIR: str(args.model_dir)}
    os.execve(sys.executable, serve_command(args.host, args.port), env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
