"""The way of one request, assembled in one place:

    resolve model → backend.stream() → measured chunks

`Pipeline.complete()` returns once the first chunk is there (so that errors found
before generation become proper HTTP errors), with the rest as an async iterator.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from redline.backends.base import Backend
from redline.cache import CachedAnswer, Lookup, ResponseCache
from redline.closing import aclose
from redline.config import RoutingConfig
from redline.errors import ModelNotFound, RedlineError
from redline.routing.router import Router, WouldMiss
from redline.telemetry.metrics import Metrics
from redline.types import Chunk, GenerationRequest, StageTimings, Usage

if TYPE_CHECKING:
    from redline.experiments import Experiments

log = logging.getLogger(__name__)

AUTO = "auto"


@dataclass
class Completion:
    """A completion in flight: what serves it, and its chunks (the first one included)."""

    request: GenerationRequest
    model: str
    tier: str
    cache: str
    chunks: AsyncIterator[Chunk]
    timings: StageTimings = field(default_factory=StageTimings)
    usage: Usage | None = None
    finish_reason: str | None = None
    status: str = "200"  # "200", "499" (client left), "500"
    ttft_s: float | None = None
    output_tokens: int = 0
    text: list[str] = field(default_factory=list)  # the answer, for observers that store it
    arm: str | None = None  # "experiment:arm" when an A/B experiment enrolled the request


class Observer(Protocol):
    """Told about every completion that ended (cache store, long-tail log, experiments)."""

    def on_finish(self, completion: Completion) -> None: ...


class Pipeline:
    def __init__(self, backends: Mapping[str, Backend], default_model: str, metrics: Metrics,
                 router: Router | None = None) -> None:
        self.backends = dict(backends)
        self.default_model = default_model
        self.metrics = metrics
        # tiers, model choice, planner, hedging, retries, breakers, admission (routing/)
        self.router = router or Router(self.backends, default_model, RoutingConfig(), metrics)
        self.observers: list[Observer] = []
        self.cache: ResponseCache | None = None  # set by create_app; looked up before routing
        self.experiments: Experiments | None = None  # set by create_app; assigns A/B arms first
        self.ready = False
        # labelled metric children, looked up once: prometheus_client's labels() costs more
        # than the observation (ten of them a request)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    async def start(self) -> None:
        await asyncio.gather(self.router.start(), *(b.start() for b in self.backends.values()),
                             *([self.cache.start()] if self.cache else []))
        for name in self.backends:
            self.metrics.backend_up.labels(name).set(1)
        self.ready = True

    async def close(self) -> None:
        self.ready = False
        await asyncio.gather(*(b.close() for b in self.backends.values()), return_exceptions=True)
        if self.cache is not None:
            await self.cache.close()  # finish pending answer writes while the store is open

    def model_names(self) -> list[str]:
        return list(self.backends)

    def resolve(self, name: str) -> str:
        if name == AUTO:
            return self.default_model
        if name not in self.backends:
            raise ModelNotFound(f"The model `{name}` does not exist.", param="model")
        return name

    async def complete(self, request: GenerationRequest,
                       on_routed: Callable[[str, str], None] | None = None) -> Completion:
        """`on_routed(model, tier)`: called while the first token is awaited (see
        Router.open), for work that would otherwise follow it."""
        # the arm first: it may rewrite the model or sampling that everything after sees
        assigned = self.experiments.assign(request) if self.experiments is not None else None
        completion = await self._complete(request, on_routed)
        completion.arm = assigned.label if assigned is not None else None
        return completion

    async def _complete(self, request: GenerationRequest,
                        on_routed: Callable[[str, str], None] | None = None) -> Completion:
        cached = None
        if self.cache is not None:
            self.resolve(request.model)  # an unknown model is a 404, not a cache miss
            cached = await self.cache.lookup(request)
            if cached.answer is not None:
                return self._replay(request, cached, cached.answer)
        self.metrics.inflight.inc()
        try:
            routed = await self.router.open(request, on_routed)  # returns at the first chunk
        except RedlineError as exc:
            self.metrics.inflight.dec()
            self.metrics.requests.labels(f"{exc.status}").inc()
            raise
        except WouldMiss:  # the caller turns it into a job
            self.metrics.inflight.dec()
            raise
        except BaseException:
            self.metrics.inflight.dec()
            self.metrics.requests.labels("500").inc()
            raise
        completion = Completion(request, routed.model, routed.tier,
                                cached.result if cached else "miss", chunks=_empty())
        if cached is not None:
            completion.timings.add("cache", cached.seconds)
        completion.timings.add("route", routed.route_s)
        first, stream = routed.first, routed.rest
        completion.chunks = self._measured(completion, first, stream)
        self._absorb(completion, first)
        return completion

    def _replay(self, request: GenerationRequest, cached: Lookup, answer: CachedAnswer) -> Completion:
        """A cache hit, served as a normal completion: the stored answer in a few chunks."""
        completion = Completion(request, answer.model, request.tier or "S", cached.result,
                                chunks=_empty())
        completion.timings.add("cache", cached.seconds)
        first, *rest = answer.chunks()
        self.metrics.inflight.inc()
        completion.chunks = self._measured(completion, first, _iterate(rest))
        self._absorb(completion, first)
        return completion

    def _absorb(self, completion: Completion, chunk: Chunk) -> None:
        if chunk.timings is not None:
            for stage, dt in chunk.timings.seconds.items():
                completion.timings.seconds[stage] = dt
        if chunk.usage is not None:
            completion.usage = chunk.usage
        if chunk.finish_reason is not None:
            completion.finish_reason = chunk.finish_reason

    async def _measured(self, completion: Completion, first: Chunk,
                        rest: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
        req = completion.request
        labels = (completion.tier, completion.model, completion.cache)
        ttft = time.perf_counter() - req.arrival
        self._child(self.metrics.ttft, *labels).observe(ttft)
        completion.ttft_s = ttft
        status = "200"
        tokens = first.tokens
        completion.text.append(first.text)
        try:
            yield first
            if first.finish_reason is None:
                async for chunk in rest:
                    tokens += chunk.tokens
                    self._absorb(completion, chunk)
                    completion.text.append(chunk.text)
                    yield chunk
                    if chunk.finish_reason is not None:
                        break
            if completion.finish_reason == "error":
                status = "500"
        except (GeneratorExit, asyncio.CancelledError):
            status = "499"  # the client went away
            raise
        finally:
            await aclose(rest)
            self.metrics.inflight.dec()
            e2e = time.perf_counter() - req.arrival
            completion.timings.seconds["total"] = e2e
            completion.status = status
            completion.output_tokens = tokens
            self._child(self.metrics.requests, status).inc()
            if status == "200":
                self._child(self.metrics.e2e, *labels).observe(e2e)
                if tokens > 1:
                    self._child(self.metrics.tpot, *labels).observe((e2e - ttft) / (tokens - 1))
                self._child(self.metrics.output_tokens, completion.model).inc(tokens)
                for stage, dt in completion.timings.seconds.items():
                    self._child(self.metrics.stage, stage).observe(dt)
                if "queue" in completion.timings.seconds:
                    self._child(self.metrics.queue, completion.model).observe(
                        completion.timings.seconds["queue"])
            for observer in self.observers:
                try:
                    observer.on_finish(completion)
                except Exception:  # an observer must never break a response
                    log.exception("observer %r failed", observer)


async def _iterate(chunks: list[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


async def _empty() -> AsyncIterator[Chunk]:
    return
    yield  # pragma: no cover
