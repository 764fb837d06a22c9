"""The ASGI app: assembles config → backends → pipeline → routes, in one place."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from fastapi import FastAPI

from redline.api import (
    admin_routes,
    batch_routes,
    embeddings_routes,
    errors,
    experiments_routes,
    jobs_routes,
    messages_routes,
    openai_routes,
    ops_routes,
    responses_routes,
    stream_routes,
    web_routes,
)
from redline.api.auth import Auth, document
from redline.api.limits import JobGate, RateLimit, TenantLimiter
from redline.api.middleware import BodyLimit, BodyTimeout, ReadyGate
from redline.api.server import CountInflight, Inflight
from redline.backends.base import Backend
from redline.cache import ResponseCache
from redline.config import ModelConfig, RedlineConfig
from redline.engine.arbiter import StepArbiter
from redline.experiments import Experiments
from redline.jobs.service import JobService
from redline.pipeline import Pipeline
from redline.routing.router import Router
from redline.store import open_store
from redline.streams import StreamManager
from redline.telemetry.live import LiveStats
from redline.telemetry.longtail import LongTailLog
from redline.telemetry.metrics import Metrics

log = logging.getLogger(__name__)



def build_backend(cfg: ModelConfig, models_dir: Path, arbiter: StepArbiter | None = None) -> Backend:
    """`arbiter`: shared by every local model of the process (they take turns on the cores)."""
    if cfg.backend == "local":
        from redline.backends.local import LocalBackend

        if cfg.replicas > 1:  # several engines of one model in this process: one pool
            from redline.backends.pool import PoolBackend

            return PoolBackend(cfg.name, [LocalBackend(cfg, models_dir, arbiter)
                                          for _ in range(cfg.replicas)],
                               cfg.placement, cfg.cache_blocks())
        return LocalBackend(cfg, models_dir, arbiter)
    if cfg.backend == "openai":
        from redline.backends.openai_compat import from_config

        return from_config(cfg)  # a pool when it has several replica urls
    raise ValueError(f"backend {cfg.backend!r} is not available yet")


def library_threads(configured: int | None, backends: Mapping[str, Backend]) -> int:
    """How many threads torch and BLAS get in this process (0: their defaults), and BLAS
    limited to it now. Where a local model runs, llama.cpp's threads hold every core and
    wait for each other at each step: OpenBLAS's workers busy-wait after every call (one
    semantic-index search every 100 ms cut the engine's batched decoding from ~240 to ~90
    tok/s on 2 cores), and torch's OpenMP team made llama.cpp's threads sleep at barriers
    (-15 %). One thread each costs little: ~16 instead of ~12 ms to embed a question."""
    threads = configured
    if threads is None:
        threads = 1 if any(b.info.kind == "local" for b in backends.values()) else 0
    if threads:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads, user_api="blas")  # process-wide, kept (not a context)
        os.environ["OPENBLAS_NUM_THREADS"] = str(threads)  # a copy loaded later (scipy's)
    return threads


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


def create_app(config: RedlineConfig, backends: Mapping[str, Backend] | None = None) -> FastAPI:
    """Build the app. `backends` replaces the configured ones (tests pass fakes)."""
    metrics = Metrics(enabled=config.telemetry.metrics)
    if backends is None:
        models_dir = config.data_path("models", ".keep").parent
        arbiter = StepArbiter()  # one budget for the cores, whatever the number of local models
        backends = {m.name: build_backend(m, models_dir, arbiter) for m in config.models}
    default = config.default_model if config.default_model in backends else next(iter(backends))
    threads = library_threads(config.server.library_threads, backends)
    pipeline = Pipeline(backends, default, metrics,
                        router=Router(backends, default, config.routing, metrics,
                                      embedder_threads=threads,
                                      capabilities={m.name: m.effective_capabilities()
                                                    for m in config.models}))
    store = open_store(config.store.url or "memory://")  # the one store: caches, journals, ...
    if config.cache.enabled:
        pipeline.cache = ResponseCache(config.cache, store, metrics, embedder_threads=threads)
        pipeline.observers.append(pipeline.cache)  # stores each fresh answer
    pipeline.experiments = Experiments(config.experiments, backends)  # A/B arms, before the cache
    pipeline.observers.append(pipeline.experiments.recorder)  # per-arm figures

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # load in the background: /healthz answers at once, /readyz once warm
        app.state.loader = asyncio.create_task(_start(pipeline))
        await app.state.jobs.start(run_worker=config.jobs.worker_in_server)
        try:
            yield
        finally:
            app.state.draining = True
            app.state.loader.cancel()
            await app.state.jobs.stop()  # running jobs go back to the queue
            await app.state.streams.close()
            await pipeline.close()
            await app.state.limiter.close()
            await store.close()

    app = FastAPI(title="redline", version="0.1.0", lifespan=lifespan,
                  description="Low-latency LLM serving layer, OpenAI-compatible.",
                  **otel_options())
    app.state.config = config
    app.state.pipeline = pipeline
    app.state.metrics = metrics
    app.state.store = store
    app.state.draining = False
    app.state.started_at = time.time()
    _telemetry(app, pipeline, config)
    app.state.streams = StreamManager(config.streams, metrics,
                                      store=lambda: getattr(app.state, "store", None))
    pipeline.observers.append(app.state.streams.history)
    app.state.limiter = TenantLimiter(config.limits, config.auth.keys, config.store.url)
    pipeline.observers.append(app.state.limiter)  # charges each answer's tokens
    app.state.jobs = JobService(config.jobs, Path(config.server.data_dir), config.store.url,
                                pipeline, metrics.jobs, jobs_routes.decode_body,
                                JobGate(app.state.limiter))
    errors.install(app)

    app.include_router(ops_routes.router)
    app.include_router(openai_routes.router)
    app.include_router(embeddings_routes.router)
    app.include_router(messages_routes.router)
    app.include_router(responses_routes.router)
    app.include_router(stream_routes.router)
    app.include_router(jobs_routes.router)
    app.include_router(batch_routes.router)
    app.include_router(admin_routes.router)
    app.include_router(experiments_routes.router)
    web_routes.install(app)
    # outermost last: BodyLimit → BodyTimeout → Auth → ReadyGate → RateLimit → CountInflight
    # → DirectRoutes (the completion routes without FastAPI's router)
    app.add_middleware(openai_routes.DirectRoutes)
    app.state.inflight = Inflight()
    app.add_middleware(CountInflight, inflight=app.state.inflight)
    app.add_middleware(RateLimit, limiter=app.state.limiter)
    app.add_middleware(ReadyGate, is_ready=lambda: pipeline.ready and not app.state.draining,
                       why=lambda: "draining" if app.state.draining else "the models are still loading")
    app.add_middleware(Auth, config=config.auth)
    app.add_middleware(BodyTimeout, timeout=config.limits.body_timeout_s)
    app.add_middleware(BodyLimit, limit=config.server.max_body_bytes,
                       per_path={"/v1/files": config.jobs.max_file_bytes + 64 * 1024})
    document(app, config.auth)
    return app


def _telemetry(app: FastAPI, pipeline: Pipeline, config: RedlineConfig) -> None:
    """Long-tail log (always: it is the SLO record) and live stats (with metrics on)."""
    budgets = config.routing.tiers
    app.state.longtail = LongTailLog(budgets, pipeline.metrics, config.telemetry.slow_log_size,
                                     store=lambda: getattr(app.state, "store", None))
    pipeline.observers.append(app.state.longtail)
    app.state.live = LiveStats(budgets) if config.telemetry.metrics else None
    if app.state.live is not None:
        pipeline.observers.append(app.state.live)


async def _start(pipeline: Pipeline) -> None:
    t0 = time.perf_counter()
    try:
        await pipeline.start()
    except Exception:
        log.exception("could not start the models")
        raise
    log.info("ready in %.1f s", time.perf_counter() - t0)
    # what startup made (models, embedder, routes) lives as long as the process: out of
    # the collector's sight, a full collection no longer walks it (pauses of tens of ms
    # at the tail while streams run); the same as vLLM and SGLang do after warm-up
    gc.collect()
    gc.freeze()
    # and a young generation of 20,000 objects instead of 700: a request or a relayed
    # token allocates hundreds (coroutines, frames, dicts), so at 700 a collection ran
    # every ~18 requests at 64 streams and traversed the in-flight requests' live objects
    # each time, ~0.1 ms of the loop per request (gc callbacks); at 20,000 most of them
    # are gone before one runs. Paired A/B at 64 streams: TTFT p50 -0.18 ms, p90 -0.64 ms
    # (docs/BENCHMARKS.md).
    gc.set_threshold(20_000, *gc.get_threshold()[1:])


__all__ = ["create_app"]
