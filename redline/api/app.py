"""The ASGI app: the services (api/services.py), the routes, and the one middleware
stack every request goes through, assembled here once.

    server ─► BodyLimit ─► BodyTimeout ─► Auth ─► ReadyGate ─► RateLimit ─► CountInflight
           ─► ReleaseSlots ─► HotRoutes ─┬─► completion routes (api/hot.py → openai_routes.serve)
                         └─► FastAPI: exception handlers, router, every other route
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence

from fastapi import FastAPI

from redline.api import (
    admin_routes,
    batch_routes,
    chat_store_routes,
    conversations_routes,
    embeddings_routes,
    errors,
    experiments_routes,
    jobs_routes,
    keys_routes,
    messages_routes,
    openai_routes,
    ops_routes,
    rerank_routes,
    responses_routes,
    stream_routes,
    tokenize_routes,
    web_routes,
)
from redline.api.auth import Auth, document
from redline.api.gate import ReleaseSlots
from redline.api.hot import HotRoutes
from redline.api.limits import RateLimit
from redline.api.middleware import BodyLimit, BodyTimeout, ReadyGate
from redline.api.server import CountInflight
from redline.api.services import Services, build
from redline.backends.base import Backend
from redline.config import RedlineConfig
from redline.pipeline import Observer, Pipeline

log = logging.getLogger(__name__)


def otel_options() -> dict[str, object]:
    """FastAPI traces requests natively (OpenTelemetry spans and metrics) once an
    OpenTelemetry SDK is set up, and looks for one on every request: three provider
    lookups on each request's path. Where none is set up when the app is made (the
    embedded default: only the API is installed), that per-request look is turned off.
    `opentelemetry-instrument redline serve` sets its providers first, so it keeps the
    spans, as does FASTAPI_OTEL_AUTO_CONFIGURE=true (FastAPI sets them up at startup)."""
    if os.getenv("FASTAPI_OTEL_AUTO_CONFIGURE", "").lower() == "true":
        return {}
    try:
        from opentelemetry import metrics, trace
        from opentelemetry._logs import get_logger_provider
    except ImportError:
        return {}
    # the API's placeholders until an SDK sets real providers
    unset = {"ProxyTracerProvider", "_ProxyMeterProvider", "ProxyLoggerProvider"}
    providers = (trace.get_tracer_provider(), metrics.get_meter_provider(), get_logger_provider())
    if any(type(p).__name__ not in unset for p in providers):
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


def create_app(config: RedlineConfig, backends: Mapping[str, Backend] | None = None,
               observers: Sequence[Observer] = ()) -> FastAPI:
    """Build the app. `backends` replaces the configured ones (tests pass fakes);
    `observers` are told of every finished request (an embedding application's)."""
    services = build(config, backends, observers)
    pipeline = services.pipeline

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # load in the background: /healthz answers at once, /readyz once warm
        loader = services.loader = asyncio.create_task(_start(pipeline, services))
        await services.jobs.start(run_worker=config.jobs.worker_in_server)
        try:
            yield
        finally:
            services.draining = True
            loader.cancel()
            await services.jobs.stop()  # running jobs go back to the queue
            await services.streams.close()
            await pipeline.close()
            await services.limiter.close()
            await services.gate.close()
            await services.usage.close()  # the last counts, while the store is open
            await services.store.close()

    app = FastAPI(title="redline", version="0.1.0", lifespan=lifespan,
                  description="Low-latency LLM serving layer, OpenAI-compatible.",
                  **otel_options())  # type: ignore[arg-type]  # FastAPI's keywords, typed one by one
    app.state.services = services  # the only thing kept there: read it with services_of(app)
    errors.install(app)

    app.include_router(ops_routes.router)
    app.include_router(openai_routes.router)
    app.include_router(embeddings_routes.router)
    app.include_router(rerank_routes.router)
    app.include_router(tokenize_routes.router)
    app.include_router(messages_routes.router)
    app.include_router(responses_routes.router)
    app.include_router(conversations_routes.router)
    app.include_router(chat_store_routes.router)
    app.include_router(stream_routes.router)
    app.include_router(jobs_routes.router)
    app.include_router(batch_routes.router)
    app.include_router(admin_routes.router)
    app.include_router(keys_routes.router)
    app.include_router(experiments_routes.router)
    web_routes.install(app)
    # added innermost first: the stack in the module's docstring
    app.add_middleware(HotRoutes, services=services)
    app.add_middleware(ReleaseSlots, gate=services.gate)
    app.add_middleware(CountInflight, inflight=services.inflight)
    app.add_middleware(RateLimit, limiter=services.limiter)
    app.add_middleware(ReadyGate, is_ready=lambda: pipeline.ready and not services.draining,
                       why=lambda: "draining" if services.draining else "the models are still loading")
    app.add_middleware(Auth, config=config.auth, managed=services.keys)
    app.add_middleware(BodyTimeout, timeout=config.limits.body_timeout_s)
    app.add_middleware(BodyLimit, limit=config.server.max_body_bytes,
                       per_path={"/v1/files": config.jobs.max_file_bytes + 64 * 1024})
    document(app, config.auth)
    return app


async def _start(pipeline: Pipeline, services: Services) -> None:
    t0 = time.perf_counter()
    try:
        await pipeline.start()
    except Exception:
        log.exception("could not start the models")
        raise
    log.info("ready in %.1f s", time.perf_counter() - t0)
    services.started.set()  # `redline serve` tunes the collector then (redline/tuning.py)


__all__ = ["create_app"]
