"""``python -m tools.start_cache``, what ``make start-cache`` runs (:mod:`tools.start_cache`)."""

from __future__ import annotations

import sys
from pathlib import Path

_LLM = Path(__file__).resolve().parents[2] / "containers" / "llm"
if str(_LLM) not in sys.path:  # the gateway package, as containers/llm/serve finds it
    sys.path.insert(0, str(_LLM))

from tools.start_cache.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
