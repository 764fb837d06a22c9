"""The way of one request, assembled in one place:

    prepare(request): A/B arm → cache lookup → router.plan   (nothing sent yet)
    open(prepared):   the cached answer, or router.open(plan) → measured chunks
    every completion's end → a `Finished` record (types.py) → each observer

The caller sees the prepared request between the two steps (its model, its tier, a plan
that would miss its budget) and makes what it needs from it; nothing calls back up.
`open()` returns once the first chunk is there (so that errors found before generation
become proper HTTP errors), with the rest as an async iterator.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from redline.backends.base import Calibrates
from redline.backends.pool import replicas_of
from redline.cache import CachedAnswer, Lookup, ResponseCache
from redline.closing import aclose
from redline.errors import RedlineError
from redline.routing.router import RoutePlan, Router
from redline.telemetry.metrics import Metrics
from redline.types import Chunk, Finished, GenerationRequest, StageTimings, Usage

if TYPE_CHECKING:
    from redline.experiments import Experiments

log = logging.getLogger(__name__)


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
    shortened_to: int | None = None  # the planner's max_tokens when it shortened the answer

    def headers(self) -> dict[str, str]:
        """What every answer's headers say of how it was served (API.md): its model, tier
        and cache result, its A/B arm, and a shortened answer's cap."""
        out = {"X-Redline-Model": self.model, "X-Redline-Tier": self.tier,
               "X-Redline-Cache": self.cache}
        if self.arm is not None:
            out["X-Redline-Arm"] = self.arm  # "experiment:arm" (A/B experiments)
        if self.shortened_to is not None:  # the planner cut max_tokens to meet the tier's budget
            out["X-Redline-Degraded"] = "shorten"
            out["X-Redline-Max-Tokens"] = str(self.shortened_to)
        return out


@dataclass(frozen=True)
class Prepared:
    """A request ready to open: its A/B arm, its cache lookup, and where it will go."""

    request: GenerationRequest
    arm: str | None
    lookup: Lookup | None  # None: no cache
    plan: RoutePlan | None  # None: answered from the cache

    @property
    def model(self) -> str:
        if self.plan is None:
            assert self.lookup is not None and self.lookup.answer is not None
            return self.lookup.answer.model
        return self.plan.model

    @property
    def tier(self) -> str:
        return (self.request.tier or "S") if self.plan is None else self.plan.tier

    @property
    def would_miss(self) -> bool:
        """No model is predicted to meet the tier's first-token budget and the client
        allows a job instead: the caller answers with one rather than open() it."""
        return self.plan is not None and self.plan.would_miss


class Observer(Protocol):
    """Told about every completion that ended (cache store, long-tail log, experiments)."""

    def on_finish(self, done: Finished) -> None: ...


class Pipeline:
    def __init__(self, router: Router, metrics: Metrics, cache: ResponseCache | None = None,
                 experiments: Experiments | None = None,
                 observers: Sequence[Observer] = ()) -> None:
        """Built whole, once (api/services.py): `router` (tiers, model choice, planner,
        hedging, retries, breakers, admission), `cache` looked up before routing,
        `experiments` assigning A/B arms first, `observers` told of every end."""
        self.router = router
        self.backends = router.backends
        self.default_model = router.default_model
        self.metrics = metrics
        self.cache = cache
        self.experiments = experiments
        self.observers: tuple[Observer, ...] = tuple(observers)
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
        # step costs measured again with everything loaded and one model at a time: the
        # planner's forecasts come from them (backends/local.py `calibrate`)
        for backend in self.backends.values():
            for replica in replicas_of(backend):
                if isinstance(replica, Calibrates):
                    await replica.calibrate()
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
        return self.router.resolve(name)

    async def prepare(self, request: GenerationRequest) -> Prepared:
        """The A/B arm (it may rewrite the model or sampling that everything after sees),
        the cache lookup, and the route plan. An unknown model is a 404 here."""
        assigned = self.experiments.assign(request) if self.experiments is not None else None
        arm = assigned.label if assigned is not None else None
        lookup = None
        if self.cache is not None:
            self.resolve(request.model)  # an unknown model is a 404, not a cache miss
            lookup = await self.cache.lookup(request)
            if lookup.answer is not None:
                return Prepared(request, arm, lookup, None)
        return Prepared(request, arm, lookup, self.router.plan(request))

    async def complete(self, request: GenerationRequest) -> Completion:
        """prepare() then open(): for callers that have nothing to do between them
        (jobs); a plan that would miss is served anyway, degraded."""
        return await self.open(await self.prepare(request))

    async def open(self, prepared: Prepared) -> Completion:
        """Serve a prepared request; returns at its first chunk."""
        lookup = prepared.lookup
        if prepared.plan is None:
            assert lookup is not None and lookup.answer is not None
            return self._replay(prepared, lookup, lookup.answer)
        self.metrics.inflight.inc()
        try:
            routed = await self.router.open(prepared.plan)  # returns at the first chunk
        except RedlineError as exc:
            self.metrics.inflight.dec()
            self.metrics.requests.labels(f"{exc.status}").inc()
            raise
        except BaseException:
            self.metrics.inflight.dec()
            self.metrics.requests.labels("500").inc()
            raise
        planned = prepared.plan.request.sampling.max_tokens
        completion = Completion(prepared.request, routed.model, routed.tier,
                                lookup.result if lookup else "miss", chunks=_empty(),
                                arm=prepared.arm,
                                shortened_to=planned if planned < prepared.request.sampling.max_tokens
                                else None)
        if lookup is not None:
            completion.timings.add("cache", lookup.seconds)
        completion.timings.add("route", routed.route_s)
        first, stream = routed.first, routed.rest
        completion.chunks = self._measured(completion, first, stream)
        self._absorb(completion, first)
        return completion

    def _replay(self, prepared: Prepared, lookup: Lookup, answer: CachedAnswer) -> Completion:
        """A cache hit, served as a normal completion: the stored answer in a few chunks."""
        completion = Completion(prepared.request, answer.model, prepared.tier, lookup.result,
                                chunks=_empty(), arm=prepared.arm)
        completion.timings.add("cache", lookup.seconds)
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
            self._tell(completion, e2e)

    def _tell(self, c: Completion, total_s: float) -> None:
        self.tell(Finished(c.request, c.model, c.tier, c.cache, c.status, c.finish_reason,
                           c.output_tokens, c.ttft_s, total_s, c.usage, "".join(c.text),
                           MappingProxyType(dict(c.timings.seconds)), c.arm))

    def tell(self, done: Finished) -> None:
        """Every observer hears of `done`: a completion's end, or a request that ran
        outside the pipeline but counts as one (an embeddings request)."""
        for observer in self.observers:
            try:
                observer.on_finish(done)
            except Exception:  # an observer must never break a response
                log.exception("observer %r failed", observer)


async def _iterate(chunks: list[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


async def _empty() -> AsyncIterator[Chunk]:
    return
    yield  # pragma: no cover
