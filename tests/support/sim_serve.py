#!/usr/bin/env python3
"""``serve`` with the simulated engine registered: what tests, benchmarks and ``make local`` start.

    python tests/support/sim_serve.py --engine sim [--host H] [--port N] [--log-level L]

The product's entry point (``containers/llm/serve`` → :func:`gateway.main.run`) knows one engine,
vLLM; this one adds ``sim`` (:mod:`tests.support.sim_engine`), whose own knobs are ``SIM_*``
variables. Everything else — options, settings, exit codes — is the product's.
"""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "containers" / "llm"), str(REPO)]

from gateway.main import EXIT_BAD_CONFIG, run  # noqa: E402
from tests.support.sim_engine import sim_builder  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Run the gateway with ``--engine sim`` available; exit 2 on a bad ``SIM_*`` value."""
    try:
        builder = sim_builder(os.environ)
    except ValueError as error:
        print(f"serve: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    return run(sys.argv[1:] if argv is None else argv, engines={"sim": builder})


if __name__ == "__main__":
    sys.exit(main())
