"""The router: from a request to a first token, on the model and replica that can meet
the request's tier budget.

    plan(request): decide (tier, candidate models) → predict TTFT/total per model
                   → a RoutePlan (model order, predictions, or "would miss")
    open(plan):    admit → open on a replica (hedged for tier S) → on an error before
                   the first token, retry within the retry budget on another replica,
                   then down the fallback chain

The caller sees the plan before anything is sent (the api prepares a stream's parts
from it, or turns a plan that would miss its tier's budget into a job): no callback up,
no exception as a routing decision. `open()` returns once the first chunk is there; the
rest of the stream is observed to keep the live estimates honest.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass

from redline.backends.base import Backend
from redline.backends.pool import PoolBackend, replicas_of
from redline.closing import aclose
from redline.config import RoutingConfig, TierBudget
from redline.errors import BackendError, InvalidRequest, RedlineError
from redline.routing.admission import Admission
from redline.routing.breaker import Breakers
from redline.routing.budget import RatioBudget
from redline.routing.capabilities import FIELDS, Capabilities, required
from redline.routing.classifier import Classifier, Decision
from redline.routing.estimates import (
    Estimates,
    Prediction,
    cores_busy,
    own_forecast,
    own_forecast_tpot,
    slowdown_of,
)
from redline.routing.hedge import Opened, hedged
from redline.routing.migrate import Migration
from redline.routing.names import AUTO, check_model, resolve_model
from redline.routing.planner import Plan, plan
from redline.telemetry.metrics import Metrics
from redline.types import Chunk, GenerationRequest

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class RoutePlan:
    """Where a request will go, decided before anything is sent."""

    request: GenerationRequest  # as it will be sent (max_tokens shortened by the planner)
    tier: str
    order: tuple[str, ...]  # models to try, best first
    predicted: Prediction | None  # the first model's predicted TTFT/total (slo mode)
    degraded: bool  # no model is predicted to meet the tier's budget
    # ... and the client allows a background job instead (`allow_background`): the
    # caller answers with a job rather than open() a late first token
    would_miss: bool
    route_s: float  # deciding and planning

    @property
    def model(self) -> str:
        return self.order[0]


@dataclass
class Routed:
    model: str
    tier: str
    first: Chunk
    rest: AsyncIterator[Chunk]
    hedged: bool = False
    attempts: int = 1
    degraded: bool = False
    route_s: float = 0.0  # deciding and planning


@dataclass
class _Call:
    replica: Backend
    first: Chunk
    rest: AsyncIterator[Chunk]
    t_first: float
    slowdown: float = 1.0  # sharing the cores at the start (local models)
    own_tpot_s: float | None = None  # the engine's own TPOT forecast at the start, alone


class Router:
    def __init__(self, backends: Mapping[str, Backend], default_model: str, config: RoutingConfig,
                 metrics: Metrics, classifier: Classifier | None = None,
                 embedder_threads: int = 1,
                 capabilities: Mapping[str, Iterable[str]] | Capabilities | None = None
                 ) -> None:
        self.backends = dict(backends)
        # what each model serves (config); `auto`, rules and fallbacks pick only among these
        self.capabilities = capabilities if isinstance(capabilities, Capabilities) \
            else Capabilities(capabilities)
        self.embedder_threads = embedder_threads  # torch's, for the embeddings classifier
        self.default_model = default_model
        self.cfg = config
        self.metrics = metrics
        self.slo = config.mode == "slo"
        self.estimates = Estimates()
        self.breakers = Breakers(config.breaker_threshold, config.breaker_ttl_s,
                                 on_change=lambda name, opened: metrics.backend_up.labels(name).set(
                                     0 if opened else 1))
        shed_at: dict[str, float] = {t: share for t, share in config.shed_at.items()}
        # by tier name as requests carry it (the config's keys are the Literal S/A/B)
        self._budgets: dict[str, TierBudget] = {t: b for t, b in config.tiers.items()}
        self.admission = Admission(config.max_inflight,
                                   {t: b.max_inflight for t, b in config.tiers.items()}, shed_at)
        self.retries = RatioBudget(config.retry_budget, burst=20.0, initial=10.0)
        self.hedges = RatioBudget(config.hedge_budget, burst=3.0, initial=1.0)
        self.classifier = classifier
        self._rules = [(re.compile(r.match, re.IGNORECASE), r) for r in config.rules]
        self._labels: dict[int, str] = {}
        for name, backend in self.backends.items():
            reps = replicas_of(backend)
            for i, r in enumerate(reps):
                self._labels[id(r)] = name if len(reps) == 1 else f"{name}/{i}"
        # preference order for `auto`: small first for simple questions
        self._by_size = sorted(self.backends, key=lambda n: self.backends[n].info.size_rank)

    async def start(self) -> None:
        if self.classifier is None and self.slo and self.cfg.classifier != "off":
            self.classifier = await asyncio.to_thread(_build_classifier, self.cfg.classifier,
                                                      self.embedder_threads, self.cfg)

    # -- deciding -------------------------------------------------------------------

    def decide(self, request: GenerationRequest) -> tuple[str, list[str], Decision | None]:
        """The tier to serve and the candidate models, best first: only models that have
        every capability the request needs (a chat request never goes to a base model)."""
        name = request.model
        needs = self.check(request)
        if not self.slo:  # FCFS, no tiers: the named (or default) model, its fallbacks
            model = resolve_model(name, self.backends, self.default_model)
            if name == AUTO and not self.capabilities.serves(model, needs):
                model = self._first_serving(needs)
            return request.tier or "S", self._chain(model, needs), None
        text = _last_user_text(request)
        rule = next((r for rx, r in self._rules if rx.search(text)), None)
        decision = None
        if self.classifier is not None and (request.tier is None or name == AUTO):
            decision = self.classifier.classify(text)
        tier = request.tier or (rule.tier if rule and rule.tier else None) or (
            decision.tier if decision else "S")
        if name != AUTO:
            return tier, self._chain(name, needs), decision
        # a rule's model that cannot serve this request is passed over, not obeyed
        if rule is not None and rule.model is not None and rule.model in self.backends \
                and self.capabilities.serves(rule.model, needs):
            return tier, self._chain(rule.model, needs), decision
        # tier S is served small-first (DESIGN: cache, small model, hedged): a large model's
        # queue is what makes interactive answers miss; complex ones go large in A and B
        complex_ = tier == "B" or (tier == "A" and decision is not None
                                   and decision.difficulty == "complex")
        order = list(reversed(self._by_size)) if complex_ else list(self._by_size)
        # never empty: check() found a model that serves it
        return tier, self.capabilities.only(order, needs), decision

    def check(self, request: GenerationRequest) -> frozenset[str]:
        """What `request` needs; a 404 for an unknown model, a 400 when the named model
        (or, for `auto`, every model) lacks any of it. The one capability check
        (routing/capabilities.py): decide() runs it, and the api runs it up front only
        for a request it queues as a job (decide runs later, in the worker)."""
        name = request.model
        check_model(name, self.backends)
        needs = required(request)
        fields = request.unmodelled() if FIELDS in needs else ()  # for a 400 to name one
        if name != AUTO:
            self.capabilities.check(name, needs, fields)
        elif not self.capabilities.only(self._by_size, needs):
            raise self.capabilities.none_serves(self._by_size, needs, fields)
        return needs

    def _first_serving(self, needs: frozenset[str]) -> str:
        return self.capabilities.only(self._by_size, needs)[0]  # check() found one

    def _chain(self, model: str, needs: frozenset[str]) -> list[str]:
        """`model`, then its configured fallbacks that can serve what the request needs."""
        chain = [model]
        for m in self.cfg.fallbacks.get(model, []):
            if m in self.backends and m not in chain and self.capabilities.serves(m, needs):
                chain.append(m)
        return chain

    # -- predicting -----------------------------------------------------------------

    def label(self, replica: Backend) -> str:
        return self._labels.get(id(replica)) or replica.info.name

    def usable(self, replica: Backend) -> bool:
        return not self.breakers.is_open(self.label(replica))

    def predict(self, model: str, prompt_tokens: int, max_tokens: int,
                tier: str | None = None,
                request: GenerationRequest | None = None) -> Prediction | None:
        best: Prediction | None = None
        for r in replicas_of(self.backends[model]):
            if not self.usable(r):
                continue
            stats = self.estimates.of(r)
            # local models: others' work on the same cores, and the engine's own forecast
            # from the work it already admitted (its slots and queue)
            p = stats.predict(r.load(), prompt_tokens, stats.expected_tokens(max_tokens),
                              slowdown_of(r), *own_forecast(r, prompt_tokens, tier, request))
            if best is None or p.ttft_s < best.ttft_s:
                best = p
        return best

    def _plan(self, tier: str, candidates: list[str], request: GenerationRequest) -> Plan:
        if not self.slo:
            return Plan(tuple(candidates), None, None, degraded=False)
        n_prompt = _prompt_tokens(request)
        max_tokens = request.sampling.max_tokens

        def tpot_of(model: str) -> float:
            return min(self.estimates.of(r).tpot_s * slowdown_of(r)
                       for r in replicas_of(self.backends[model]))

        # `auto` prefers a larger model for a complex request only while it is predicted
        # to finish within quality_total_s (routing.quality_total_s)
        within = self.cfg.quality_total_s if request.model == AUTO else None
        # tier S is the latency tier: on shared cores it stays on the cheapest model (a
        # queue there is not a reason to take more of the same cores); A and B may pay for
        # a larger one while the cores have room
        crowded = frozenset(m for m in candidates if self._crowded(m, tier)) if within \
            else frozenset()
        # a tool call or a JSON document cut short is no answer: those are never shortened
        shorten = self.cfg.shorten and not request.needs() & {"tools", "json_schema"}
        return plan(tier, self._budgets[tier], candidates,
                    lambda m: self.predict(m, n_prompt, max_tokens, tier, request), max_tokens, tpot_of,
                    shorten, within, crowded)

    def _crowded(self, model: str, tier: str) -> bool:
        """Every replica of `model` is on shared cores with no room for a dearer model:
        a tier-S request, or cores the local engines used more than
        routing.quality_headroom of lately."""
        busy = [cores_busy(r) for r in replicas_of(self.backends[model])]
        return all(b is not None and (tier == "S" or b >= self.cfg.quality_headroom)
                   for b in busy)

    # -- serving --------------------------------------------------------------------

    def resolve(self, name: str) -> str:
        """The served model `name` stands for before routing (`auto`: the default);
        ModelNotFound for one not served."""
        return resolve_model(name, self.backends, self.default_model)

    def plan(self, request: GenerationRequest) -> RoutePlan:
        """Decide the tier and the models to try, and predict whether they meet the
        tier's budget. Nothing is sent, nothing is admitted."""
        t0 = time.perf_counter()
        tier, candidates, _ = self.decide(request)
        p = self._plan(tier, candidates, request)
        if log.isEnabledFor(logging.DEBUG) and p.predicted is not None:
            log.debug("plan: tier %s -> %s (predicted TTFT %.2fs, total %.2fs%s)", tier,
                      "/".join(p.order), p.predicted.ttft_s, p.predicted.total_s,
                      ", degraded" if p.degraded else "")
        would_miss = False
        if p.degraded and p.predicted is not None:
            budget = self._budgets[tier]
            late = budget.ttft_s is not None and p.predicted.ttft_s > budget.ttft_s
            would_miss = late and request.allow_background and tier != "B"
            how = ("background" if would_miss
                   else "shorten" if p.max_tokens is not None else "fastest")
            self.metrics.degradations.labels(tier, how).inc()
        req = request
        if p.max_tokens is not None and not would_miss:
            req = dataclasses.replace(request, sampling=dataclasses.replace(
                request.sampling, max_tokens=p.max_tokens))
        if req.tier != tier:  # the engine orders its work by the tier it is served in
            req = dataclasses.replace(req, tier=tier)  # type: ignore[arg-type]  # decide() yields S/A/B (the classifier's labels are str)
        return RoutePlan(req, tier, p.order, p.predicted, p.degraded, would_miss,
                         time.perf_counter() - t0)

    async def open(self, plan: RoutePlan) -> Routed:
        """Serve `plan` and return at its first chunk. The model that answers may differ
        from the plan's first (a retry, a fallback, a hedge)."""
        tier = plan.tier
        if self.slo:
            self.admission.admit(tier)
        try:
            self.retries.deposit()
            model, call, was_hedged, attempts = await self._first_token(plan.request, tier,
                                                                        plan.order)
        except BaseException:
            if self.slo:
                self.admission.release(tier)
            raise
        rest = _Tail(self, tier, call, plan.request.arrival,
                     Migration(self, model, plan.request, call.replica))
        return Routed(model, tier, call.first, rest, was_hedged, attempts, plan.degraded,
                      plan.route_s)

    def _targets(self, order: tuple[str, ...],
                 req: GenerationRequest | None = None) -> Iterator[tuple[str, Backend]]:
        """Attempt targets: each usable replica of each model in order (a pool's in its
        placement order for `req`), then round again."""
        while True:
            any_usable = False
            for model in order:
                backend = self.backends[model]
                reps = (backend.rank(req, self.usable) if isinstance(backend, PoolBackend)
                        else replicas_of(backend))
                usable = [r for r in reps if self.usable(r)]
                any_usable |= bool(usable)
                yield from ((model, r) for r in usable)
            if not any_usable:  # all open: knock anyway, a due breaker goes half-open
                for model in order:
                    yield from ((model, r) for r in replicas_of(self.backends[model]))

    async def _first_token(self, req: GenerationRequest, tier: str,
                           order: tuple[str, ...]) -> tuple[str, _Call, bool, int]:
        last: RedlineError | None = None
        targets = self._targets(order, req)
        for attempt in range(1, self.cfg.max_attempts + 1):
            if attempt > 1 and not self.retries.take():
                break
            model, replica = next(targets)
            try:
                call, was_hedged = await self._open_maybe_hedged(req, tier, model, replica)
                return model, call, was_hedged, attempt
            except InvalidRequest:
                raise
            except RedlineError as exc:  # BackendError, NotReady, EngineDead: try elsewhere
                log.debug("attempt %d on %s failed: %s", attempt, self.label(replica), exc.message)
                self.estimates.of(replica).errors += 1
                last = exc
        raise last or BackendError("no backend could serve the request")

    async def _open_maybe_hedged(self, req: GenerationRequest, tier: str, model: str,
                                 replica: Backend) -> tuple[_Call, bool]:
        backend = self.backends[model]
        partner = None
        delay = None
        if self.slo and self.cfg.hedge and tier == "S" and isinstance(backend, PoolBackend):
            delay = self.estimates.of(replica).p90_ttft()
            partner = backend.pick(exclude=[replica], usable=self.usable, request=req)
        if isinstance(backend, PoolBackend):  # what its prefix index learns from
            backend.record(replica, req)
        if partner is None or delay is None:
            return (await self._open(replica, req)).value, False
        self.hedges.deposit()
        second = partner

        async def first() -> Opened[_Call]:
            return await self._open(replica, req)

        async def other() -> Opened[_Call]:
            if isinstance(backend, PoolBackend):
                backend.record(second, req)
            return await self._open(second, req)

        won, sent = await hedged(first, other, max(delay, self.cfg.hedge_min_delay_s),
                                 self.hedges.take)
        return won.value, sent

    async def _open(self, replica: Backend, req: GenerationRequest) -> Opened[_Call]:
        load = replica.load()
        slowdown = slowdown_of(replica)
        own_tpot = own_forecast_tpot(replica)  # before it joins: the planner's own view
        t0 = time.perf_counter()
        it = replica.stream(req).__aiter__()
        try:
            async with self.breakers.guard(self.label(replica)):
                try:
                    first = await it.__anext__()
                except StopAsyncIteration:
                    first = Chunk(finish_reason="stop")
                if first.finish_reason == "error":
                    raise BackendError(f"{self.label(replica)}: {first.error or 'failed'}")
        except BaseException:
            await aclose(it)
            raise
        t_first = time.perf_counter()
        # learnt after this step, which writes the first token to the client: the
        # estimate's update (a least-squares solve) is not on that token's path
        asyncio.get_running_loop().call_soon(
            self.estimates.of(replica).observe_ttft, t_first - t0, load, _prompt_tokens(req),
            slowdown)
        return Opened(_Call(replica, first, it, t_first, slowdown, own_tpot), lambda: aclose(it))

    def finish(self, tier: str, call: _Call, arrival: float, tokens: int, ok: bool) -> None:
        if self.slo:
            self.admission.release(tier)
        end = time.perf_counter()
        stats = self.estimates.of(call.replica)
        if ok:
            stats.observe_output(tokens)
            if tokens > 1:
                # the sharing seen over the stream: the mean of its two ends
                stats.observe_tpot((end - call.t_first) / (tokens - 1), slowdown=(
                    call.slowdown + slowdown_of(call.replica)) / 2, own_s=call.own_tpot_s)
        # SLO violations are counted from the finished completion by telemetry's long-tail log


class _Tail:
    """The chunks after the first. Closing it (or finishing it) closes the upstream call
    and settles the books exactly once, even if it was never iterated. When the replica
    fails mid-stream, the stream moves to another one where it can (routing/migrate.py)."""

    def __init__(self, router: Router, tier: str, call: _Call, arrival: float,
                 migration: Migration | None = None) -> None:
        self.router, self.tier, self.call, self.arrival = router, tier, call, arrival
        self.tokens = call.first.tokens
        self.done = call.first.finish_reason is not None
        self.ok = self.done and call.first.finish_reason != "error"
        self.closed = False
        self.migration = migration
        if migration is not None:
            migration.seen(call.first)

    def __aiter__(self) -> _Tail:
        return self

    async def __anext__(self) -> Chunk:
        if self.done:
            await self.aclose()
            raise StopAsyncIteration
        try:
            chunk = await self.call.rest.__anext__()
        except StopAsyncIteration:
            self.done = self.ok = True
            await self.aclose()
            raise
        except InvalidRequest:
            await self.aclose()
            raise
        except RedlineError as exc:  # the engine stopped mid-stream
            moved = await self._move(exc.message)
            if moved is None:
                await self.aclose()
                raise
            chunk = moved
        except BaseException:
            await self.aclose()
            raise
        if chunk.finish_reason == "error":
            chunk = await self._move(chunk.error or "failed") or self._failed(chunk)
        if self.migration is not None:
            self.migration.seen(chunk)
        self.tokens += chunk.tokens
        if chunk.finish_reason is not None:
            self.done = True
            self.ok = chunk.finish_reason != "error"
        return chunk

    async def _move(self, error: str) -> Chunk | None:
        """The first chunk of the stream's rest on another replica (None: it stays)."""
        m = self.migration
        if m is None:
            return None
        failed = self.call
        moved = await m.move(failed, error)
        if moved is None:
            return Chunk(finish_reason="length") if m.complete() else None
        await aclose(failed.rest)
        self.call = moved
        return moved.first

    def _failed(self, chunk: Chunk) -> Chunk:
        if self.migration is not None:
            chunk.error = self.migration.failure(chunk.error or "failed")
        return chunk

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await aclose(self.call.rest)
        finally:
            self.router.finish(self.tier, self.call, self.arrival, self.tokens, self.ok)


def _last_user_text(request: GenerationRequest) -> str:
    if request.messages:
        for m in reversed(request.messages):
            if m.role == "user":
                return m.content
        return request.messages[-1].content
    # a list of prompts goes to one model: the longest one speaks for them
    return max(request.prompts, key=len) if request.prompts else request.prompt or ""


def _prompt_tokens(request: GenerationRequest) -> int:
    """A tokenizer-free estimate (≈4 characters a token) for the planner: every prompt of
    a list is prefilled."""
    prompts = request.prompts or (request.prompt or "",)
    n = sum(len(p) for p in prompts) + sum(len(m.content) for m in request.messages or ())
    return max(1, n // 4 + sum(len(ids) for ids in request.prompt_ids))


def _build_classifier(kind: str, embedder_threads: int = 1,
                      cfg: RoutingConfig | None = None) -> Classifier:
    min_confidence = cfg.classifier_min_confidence if cfg is not None else 0.0
    default_tier = cfg.classifier_default_tier if cfg is not None else "S"
    if kind == "embeddings":
        from redline.routing.classifier import EmbeddingFeatures

        return Classifier(EmbeddingFeatures(embedder_threads), min_confidence=min_confidence,
                          default_tier=default_tier)
    return Classifier(min_confidence=min_confidence, default_tier=default_tier)
