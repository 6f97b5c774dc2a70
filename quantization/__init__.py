"""AWQ INT4 quantization of the served base model, calibrated on manga-domain chat, with a gate.

A job, not a service (docs/design-decisions.md#quantization-job; docs/quantization.md). Its
pure parts — calibration formatting in the production system prompt (:mod:`prompts`,
:mod:`quantization.calibration`), response scoring and hallucination detection
(:mod:`quantization.scoring`), the gate decision and its reports (:mod:`quantization.gate`) and
checkpoint sizes (:mod:`quantization.checkpoint`) — import neither torch nor any ML library and
run in the main environment. The shells that touch models (:mod:`quantization.awq`,
:mod:`quantization.generation`, and :mod:`quantization.evaluate` when it generates) import
llm-compressor / AutoAWQ / transformers / vLLM inside the functions that need them: they run in
the quantization environment (``.venv-quant`` or the ``containers/quantize`` image), or in the
serving image for vLLM.
"""
