"""Operator command: an environment's capacity plan, the pool comparison and decode-profile
estimates (``python -m tools.capacity``, ``make capacity``), over the pure :mod:`capacity_model`."""
