"""``python -m gpu_budget``: see :mod:`gpu_budget.cli`."""

from gpu_budget.cli import main

raise SystemExit(main())
