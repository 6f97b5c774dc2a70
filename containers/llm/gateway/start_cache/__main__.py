"""``python -m gateway.start_cache``, the command ``make start-cache`` runs."""

from __future__ import annotations

import sys

from gateway.start_cache.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
