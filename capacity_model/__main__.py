"""``python -m capacity_model``: see :mod:`capacity_model.cli`."""

from capacity_model.cli import main

raise SystemExit(main())
