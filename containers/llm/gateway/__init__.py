"""MangaAssist LLM gateway: the request path in front of the inference engine.

OpenAI-compatible chat completions (SageMaker's ``/invocations`` and ``/v1/chat/completions``)
with adapter routing, a sliding-window context budget counted in the served model's tokens,
KV-aware admission, an OOM circuit breaker with a controlled fallback, engine supervision and
CloudWatch EMF metrics. ``containers/llm/serve`` runs it; see docs/gateway.md.
"""

__version__ = "0.1.0"
