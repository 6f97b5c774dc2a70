"""The gateway's HTTP layer: where a request enters, where it is validated, where its errors are
built, and the serving handler that answers it.

* :mod:`~gateway.api.routes` — the FastAPI app: thin routes, error handlers, the OpenAPI document.
* :mod:`~gateway.api.handlers` — the routes' work: sessions, refusals, the one log line.
* :mod:`~gateway.api.protocol` — the request and response models (OpenAI's shapes and the
  ``mangaassist`` extension), with :mod:`~gateway.api.openai_fields`: each OpenAI field served
  or refused, and why.
* :mod:`~gateway.api.errors` — :class:`~gateway.api.errors.ApiError`, the one error base, and what
  a refused request is told (field path, sentence, code).
* :mod:`~gateway.api.edge` — the body-size limit and the arrival screen, before a body is parsed.
* :mod:`~gateway.api.serving` — :class:`~gateway.api.serving.ChatService`, the serving handler
  (validate → route → budget → admit → generate → contain), and :mod:`~gateway.api.chat_run`,
  the run it hands back; :mod:`~gateway.api.responses` builds the OpenAI-shaped answer.

The package sits above the rest of the gateway: it imports the runtime's parts (admission,
breaker, engines, routing ...), and nothing outside it but :mod:`gateway.app` imports it.
"""
