"""Everything a request meets, built whole in one place from the config:

    config → backends → router, cache, experiments → observers → Pipeline → jobs

`build()` is the one factory: nothing is attached or appended afterwards. The app
(api/app.py) keeps the result as `app.state.services`, the one thing it keeps there, and
every route, the server and the command line reach it through `services_of(app)`: a
reader follows each service from here, not from a bag of names on `app.state`. The
process-wide tuning (threads, the collector) is `redline serve`'s (redline/tuning.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redline.api.gate import GenerationGate, JobGate
from redline.api.job_body import JobShapes, decode_body
from redline.api.keyring import ManagedKeys
from redline.api.limits import TenantLimiter, storage_url
from redline.api.responses_background import Background
from redline.backends.base import Backend
from redline.backends.local import LocalBackend
from redline.cache import ResponseCache
from redline.cache.judge import errors_by_model, question_judge
from redline.config import ModelConfig, RedlineConfig
from redline.engine.arbiter import StepArbiter
from redline.experiments import Experiments
from redline.jobs.service import JobService
from redline.pipeline import Observer, Pipeline
from redline.routing.capabilities import Capabilities
from redline.routing.router import Router
from redline.store import open_store
from redline.store.base import Store
from redline.store.keys import KeyStore
from redline.store.leases import RedisLeases
from redline.streams import StreamManager
from redline.telemetry.live import LiveStats
from redline.telemetry.longtail import Budget, LongTailLog
from redline.telemetry.metrics import Metrics
from redline.telemetry.usage import UsageLog

log = logging.getLogger(__name__)


class Inflight:
    """How many /v1/* requests are being served (a stream counts until its last byte)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


@dataclass
class Services:
    config: RedlineConfig
    metrics: Metrics
    store: Store
    pipeline: Pipeline
    streams: StreamManager
    limiter: TenantLimiter
    longtail: LongTailLog
    live: LiveStats | None
    jobs: JobService
    experiments: Experiments  # the pipeline's (it assigns the arms); read by the admin routes
    keys: ManagedKeys  # managed API keys (/v1/admin/keys), looked up by Auth
    usage: UsageLog  # per tenant, key and model (/v1/admin/usage)
    gate: GenerationGate  # per key: allowlist, budget, concurrent generations, tokens
    inflight: Inflight = field(default_factory=Inflight)
    started_at: float = field(default_factory=time.time)
    started: asyncio.Event = field(default_factory=asyncio.Event)  # the models are loaded
    loader: asyncio.Task[None] | None = None  # loads the models (the app's lifespan starts it)
    draining: bool = False  # set by the drain (SIGTERM, api/server.py) and at shutdown


def services_of(app: Any) -> Services:
    """The services of an app made by `create_app` (`request.app` in a route): the one
    way anything reaches them."""
    services = app.state.services
    if not isinstance(services, Services):
        raise TypeError(f"{app!r} was not made by redline's create_app")
    return services


def build_backend(cfg: ModelConfig, models_dir: Path, arbiter: StepArbiter | None = None) -> Backend:
    """`arbiter`: shared by every local model of the process (they take turns on the cores)."""
    if cfg.backend == "local":
        from redline.backends.local import LocalBackend

        if cfg.replicas > 1:  # several engines of one model in this process: one pool
            from redline.backends.pool import PoolBackend

            return PoolBackend(cfg.name, [LocalBackend(cfg, models_dir, arbiter)
                                          for _ in range(cfg.replicas)],
                               cfg.placement, cfg.cache_blocks(), cfg.load_cost_tokens())
        return LocalBackend(cfg, models_dir, arbiter)
    if cfg.backend == "openai":
        from redline.backends.openai_compat import from_config

        return from_config(cfg)  # a pool when it has several replica urls
    raise ValueError(f"backend {cfg.backend!r} is not available yet")


def library_threads(configured: int | None, kinds: Iterable[str]) -> int:
    """How many threads torch and BLAS get (0: their defaults), given the backends'
    kinds: the configured number, else one where a local model runs (its llama.cpp
    threads hold every core; see redline/tuning.py)."""
    if configured is not None:
        return configured
    return 1 if "local" in kinds else 0


def shared_leases(config: RedlineConfig) -> RedisLeases | None:
    """Leases in Redis for the concurrency cap, where the rate limits are counted in
    Redis (replicas share them); None: each replica counts its own."""
    if config.limits.max_concurrent is None and not config.auth.keys:
        return None  # no cap anywhere (a managed key's own cap needs keys configured)
    url = storage_url(config.limits, config.store.url).removeprefix("async+")
    if not url.startswith(("redis://", "rediss://")):
        return None
    return RedisLeases(url, config.limits.concurrent_lease_s)


def build(config: RedlineConfig, backends: Mapping[str, Backend] | None = None,
          observers: Sequence[Observer] = ()) -> Services:
    """`backends` replaces the configured ones (tests pass fakes); `observers` are told
    of every finished request after redline's own (an embedding application's)."""
    metrics = Metrics(enabled=config.telemetry.metrics)
    if backends is None:
        models_dir = config.data_path("models", ".keep").parent
        arbiter = StepArbiter()  # one budget for the cores, whatever the number of local models
        backends = {m.name: build_backend(m, models_dir, arbiter) for m in config.models}
    metrics.watch_engines(lambda: {name: b.stats() for name, b in backends.items()
                                   if isinstance(b, LocalBackend)})
    named = config.default_model
    default = named if named is not None and named in backends else next(iter(backends))
    threads = library_threads(config.server.library_threads,
                              [b.info.kind for b in backends.values()])
    router = Router(backends, default, config.routing, metrics, embedder_threads=threads,
                    capabilities=Capabilities.of_models(config.models))
    store = open_store(config.store.url or "memory://")  # the one store: caches, journals, ...
    questions = question_judge(config.cache, config.models)
    if config.cache.judge == "questions" and questions is None:
        log.warning("cache.judge: questions, but no chat model to ask: the answers judge decides")
    cache = (ResponseCache(config.cache, store, metrics, embedder_threads=threads,
                           backends=backends,  # the error budget's checks, and their judge's errors
                           judges=errors_by_model(config.models, config.cache.shadow_agreement),
                           questions=questions)
             if config.cache.enabled else None)
    experiments = Experiments(config.experiments, backends)  # A/B arms, before the cache
    streams = StreamManager(config.streams, metrics, store=lambda: store)
    limiter = TenantLimiter(config.limits, config.auth.keys, config.store.url)
    budgets: dict[str, Budget] = {t: b for t, b in config.routing.tiers.items()}
    # the long-tail log always (it is the SLO record); live stats with metrics on
    longtail = LongTailLog(budgets, metrics, config.telemetry.slow_log_size, store=lambda: store)
    live = LiveStats(budgets) if config.telemetry.metrics else None
    usage = UsageLog(lambda: store, config.telemetry.usage_flush_s, config.telemetry.usage_retention_s)
    gate = GenerationGate(limiter, config.limits, usage, store, shared_leases(config))
    told: list[Observer] = [
        *([cache] if cache is not None else []),  # stores each fresh answer
        experiments.recorder,  # per-arm figures
        longtail,
        *([live] if live is not None else []),
        streams.history,  # answer lengths, for the progress estimate
        limiter,  # charges each answer's tokens
        gate,  # frees its generation slot, charges a key's budget
        usage,  # counts it per tenant, key and model
        *observers,
    ]
    pipeline = Pipeline(router, metrics, cache, experiments, told)
    keys = ManagedKeys(KeyStore(store), config.auth.key_cache_s)
    job_gate = JobGate(limiter, gate, keys, config.auth.keys)  # jobs are charged to their key
    background = Background(pipeline, streams, store, config.responses.ttl_s, job_gate)
    shapes = JobShapes(config, pipeline, background.records)  # batch lines as the api answers
    jobs = JobService(config.jobs, Path(config.server.data_dir), config.store.url,
                      pipeline, metrics.jobs, decode_body, shapes, job_gate,
                      respond=background.run)  # background responses (/v1/responses)
    return Services(config, metrics, store, pipeline, streams, limiter, longtail, live, jobs,
                    experiments, keys, usage, gate)


__all__ = ["Inflight", "Services", "build", "build_backend", "library_threads", "services_of",
           "shared_leases"]
