"""Operator command: the GPU memory budget of a configuration or of an environment's LLM endpoint,
static vs paged KV, the instance catalog (``python -m tools.budget``, ``make budget``), over the
pure :mod:`gpu_budget`."""
