"""``python -m tools.capacity``: see :mod:`tools.capacity.cli`."""

from tools.capacity.cli import main

raise SystemExit(main())
