"""Where a request enters the gateway: the FastAPI app, its routes and its error handlers.

SageMaker's /ping and /invocations, OpenAI's /v1/chat/completions and /v1/models. The routes are
thin: each hands its request to :class:`~gateway.api.handlers.Handlers`. The request body is
validated by the protocol models (:mod:`gateway.api.protocol`) before a route runs; a body that
fails is a 400 naming the field (:mod:`gateway.api.errors`), a body over the limit a 413 before it
is read (:mod:`gateway.api.edge`). The published OpenAPI document is FastAPI's without the 422s,
with this instance's limits.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway import __version__
from gateway.api.edge import (
    BODY_SCOPE_KEY,
    CHAT_RESPONSES,
    INVOCATION_RESPONSES,
    ArrivalScreen,
    BodyLimitMiddleware,
    publish_limits,
    validation_problem,
)
from gateway.api.errors import ApiError, unparsable_body
from gateway.api.handlers import Handlers
from gateway.api.protocol import (
    ChatCompletionRequest,
    InvocationBody,
    ModelList,
    PingResponse,
    SessionRequest,
)

Lifespan = Callable[[Any], AbstractAsyncContextManager[None]]
"""The process lifecycle's lifespan (:meth:`gateway.lifecycle.GatewayLifecycle.lifespan`)."""


def build_app(handlers: Handlers, *, lifespan: Lifespan) -> FastAPI:
    """The FastAPI app over ``handlers``: routes, error handlers, the body limit and
    the OpenAPI document."""
    app = FastAPI(
        title="MangaAssist LLM gateway",
        version=__version__,
        description=(
            "OpenAI-compatible chat completions for the MangaAssist GPU tier: adapter routing, "
            "sliding-window context budget, KV-aware admission and an OOM circuit breaker in "
            "front of the inference engine. Extension fields live in the `mangaassist` object."),
        lifespan=lifespan,
    )
    _add_error_handlers(app, handlers)
    _add_routes(app, handlers)
    app.openapi = _openapi_document(app, handlers)  # type: ignore[method-assign]
    _add_body_limit(app, handlers)
    return app


def _add_error_handlers(app: FastAPI, handlers: Handlers) -> None:
    """Validation errors are 400 naming the field, unknown paths 404/405, anything unexpected a
    500 that says the request was not processed: each one OpenAI-shaped, built in one place
    (:func:`gateway.api.responses.error_response`) and logged as the request's line."""

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        problem = validation_problem(list(exc.errors()))
        return handlers.refuse(request.scope, ApiError.bad_request(problem))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and isinstance(request.scope.get(BODY_SCOPE_KEY), bytes):
            # FastAPI's "error parsing the body": not UTF-8, or nested beyond the parser.
            problem = unparsable_body(request.scope[BODY_SCOPE_KEY])
            return handlers.refuse(request.scope, ApiError.bad_request(problem))
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = f"{request.method} {request.url.path}: {exc.detail}"
        error = ApiError(exc.status_code, message, code=code, headers=dict(exc.headers or {}))
        return handlers.refuse(request.scope, error)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        handlers.telemetry.log("unhandled_error", level="error", path=request.url.path,
                              error=repr(exc)[:500])
        return handlers.refuse(request.scope, ApiError(
            500, "internal error in the gateway; the request was not processed",
            type_="server_error", code="internal_error"))


def _add_routes(app: FastAPI, handlers: Handlers) -> None:
    """SageMaker's /ping and /invocations, OpenAI's chat completions and model list, and in
    test mode the OOM injection."""

    @app.get("/ping", response_model=PingResponse, tags=["health"],
             responses={503: {"model": PingResponse,
                              "description": "Warming up, crash loop, failed or draining."}})
    async def ping() -> JSONResponse:
        """SageMaker health check: answers from state in well under 2 s."""
        return handlers.ping()

    @app.post("/invocations", tags=["chat"], responses=INVOCATION_RESPONSES, response_model=None,
              summary="SageMaker invoke: OpenAI chat completion, or a stateful-session request")
    async def invocations(request: Request, body: InvocationBody) -> Response:
        """A chat completion (as /v1/chat/completions), or ``{"requestType": "NEW_SESSION"}`` /
        ``{"requestType": "CLOSE"}`` (SageMaker stateful sessions: the id travels in the
        X-Amzn-SageMaker-Session-Id / -New-Session-Id / -Closed-Session-Id headers)."""
        if isinstance(body, SessionRequest):
            return handlers.session_request(request, body)
        return await handlers.chat(request, body)

    @app.post("/v1/chat/completions", tags=["chat"], responses=CHAT_RESPONSES,
              response_model=None, summary="OpenAI chat completion")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        return await handlers.chat(request, body)

    @app.get("/v1/models", response_model=ModelList, tags=["chat"])
    async def models() -> dict[str, Any]:
        """The base model and the served LoRA adapters."""
        return handlers.model_list()

    if handlers.settings.gateway.test_mode:
        @app.post("/admin/engine/oom", include_in_schema=False)
        async def inject_oom() -> JSONResponse:
            return handlers.inject_oom()


def _openapi_document(app: FastAPI, handlers: Handlers) -> Callable[[], dict[str, Any]]:
    """``app.openapi``: FastAPI's document without the 422s (we answer 400) and with this
    instance's limits (:func:`gateway.api.edge.publish_limits`), built once."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            for path_item in schema.get("paths", {}).values():
                for operation in path_item.values():
                    operation.get("responses", {}).pop("422", None)  # we answer 400
            components = schema.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                components.pop(name, None)
            settings = handlers.settings
            publish_limits(schema, served_names=handlers.router.served_names(),
                           max_n=min(settings.gateway.max_n, settings.engine.max_num_seqs),
                           max_messages=settings.gateway.max_messages,
                           max_output_tokens=settings.engine.max_model_len - 1)
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi


def _add_body_limit(app: FastAPI, handlers: Handlers) -> None:
    """Bodies over GATEWAY_MAX_BODY_BYTES are 413 before they are read (logged as the request);
    inside that, the arrival screen answers what admission refuses before it is parsed."""
    app.add_middleware(ArrivalScreen, screen=handlers.screen)
    app.add_middleware(BodyLimitMiddleware, max_bytes=handlers.settings.gateway.max_body_bytes,
                       refuse=handlers.refuse, clock=handlers.clock)
