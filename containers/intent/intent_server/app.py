"""The HTTP shell: SageMaker's GET /ping and POST /invocations.

The port opens at once; the model loads and warms in a background thread. Until then /ping
answers 503 ``loading`` (SageMaker waits, up to the variant's ContainerStartupHealthCheckTimeout),
afterwards 200 ``ready``; a load failure keeps it at 503 ``failed`` with the reason, which
SageMaker logs and acts on. /ping only reads state, so it answers in microseconds even while
every model copy is busy. /invocations runs the blocking classification in a worker thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from intent_server.classifier import ArtifactError, Classification, IntentClassifier
from intent_server.invocation import InvocationError, Limits, error_body, parse_invocation
from intent_server.metrics import EmfWriter, invocation_documents
from intent_server.placement import ReplicaTimeout
from intent_server.settings import ServerSettings
from neuron.manifest import ArtifactManifest

LOG = logging.getLogger("intent_server")

LOADING, READY, FAILED = "loading", "ready", "failed"


@dataclass
class ServerState:
    """What /ping reports, guarded by a lock (written by the loader thread)."""

    status: str = LOADING
    error: str | None = None
    classifier: IntentClassifier | None = None
    loaded_s: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def load(self, load_classifier: Callable[[], IntentClassifier]) -> None:
        """Load and warm the model (the loader thread's body): READY, or FAILED with why."""
        started = time.perf_counter()
        try:
            classifier = load_classifier()
        except Exception as error:  # any load failure must show on /ping, not kill the thread
            message = str(error) if isinstance(error, ArtifactError) else (
                f"{type(error).__name__}: {error}")
            LOG.error("model load failed: %s", message)
            with self.lock:
                self.status, self.error = FAILED, message
            return
        with self.lock:
            self.classifier = classifier
            self.loaded_s = time.perf_counter() - started
            self.status = READY
        LOG.info("ready: loaded and warmed in %.1f s", self.loaded_s)


def create_app(settings: ServerSettings, manifest: ArtifactManifest,
               load_classifier: Callable[[], IntentClassifier], emf: EmfWriter) -> FastAPI:
    """Build the app; ``load_classifier`` runs in a background thread at start-up."""
    state = ServerState()
    lock = state.lock
    limits = Limits(max_body_bytes=settings.max_body_bytes,
                    max_text_chars=settings.max_text_chars,
                    max_batch_texts=settings.max_batch_texts)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        thread = threading.Thread(target=state.load, args=(load_classifier,),
                                  name="model-loader", daemon=True)
        thread.start()
        yield

    app = FastAPI(title="MangaAssist intent classifier", lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/ping")
    async def ping() -> JSONResponse:
        with lock:
            status, error, classifier = state.status, state.error, state.classifier
        if status == READY and classifier is not None:
            return JSONResponse({"status": READY, "target": manifest.target.value,
                                 "copies": classifier.pool.size,
                                 "batch_sizes": list(manifest.batch_sizes)})
        body: dict[str, Any] = {"status": status}
        if error:
            body["error"] = error
        return JSONResponse(body, status_code=503)

    @app.post("/invocations")
    async def invocations(request: Request) -> JSONResponse:
        with lock:
            classifier, status = state.classifier, state.status
        if classifier is None:
            return JSONResponse(error_body(503, f"model is {status}; retry shortly"),
                                status_code=503, headers={"Retry-After": "5"})
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > settings.max_body_bytes:
            return _refuse(InvocationError(413, f"body: {declared} bytes; the limit is "
                                                f"{settings.max_body_bytes}"))
        body = await _read_limited(request, settings.max_body_bytes)
        try:
            parsed = parse_invocation(body, request.headers.get("content-type"), limits)
        except InvocationError as error:
            return _refuse(error)
        try:
            result: Classification = await run_in_threadpool(classifier.classify,
                                                             list(parsed.texts))
        except ReplicaTimeout as error:
            return JSONResponse(error_body(503, f"busy: {error}"), status_code=503,
                                headers={"Retry-After": "1"})
        emf.write(invocation_documents(
            endpoint_name=settings.metrics_endpoint_name,
            variant_name=settings.metrics_variant_name, latency_ms=result.latency_ms,
            intents=[p.intent for p in result.predictions],
            truncations=sum(1 for p in result.predictions if p.truncated),
            timestamp_ms=int(time.time() * 1000), target=manifest.target.value))
        answers = [p.to_json(max_seq_length=manifest.max_seq_length)
                   for p in result.predictions]
        return JSONResponse({"predictions": answers} if parsed.batch else answers[0])

    return app


def _refuse(error: InvocationError) -> JSONResponse:
    return JSONResponse(error_body(error.status, error.message), status_code=error.status)


async def _read_limited(request: Request, max_body_bytes: int) -> bytes:
    """Read the body, stopping one byte past the limit (chunked uploads have no length)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > max_body_bytes:
            break
    return b"".join(chunks)
