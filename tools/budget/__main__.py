"""``python -m tools.budget``: see :mod:`tools.budget.cli`."""

from tools.budget.cli import main

raise SystemExit(main())
