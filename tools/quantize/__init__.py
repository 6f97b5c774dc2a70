"""Operator command: the AWQ quantization job on SageMaker (``python -m tools.quantize``,
``make quantize``). :mod:`tools.quantize.plan` is its pure part (what to start, how to read the
outcome), tested without the SDK; ``__main__`` is the thin shell around the sagemaker SDK."""
