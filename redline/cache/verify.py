"""The error budget kept on live traffic (`cache.max_wrong_hit_rate`).

    note(request, entry, similarity, answer, served)  at lookup: maybe sample this hit
    finished(done)                                    at the request's end: queue the check
    threshold / semantic_on / barred(entry, s)        what the lookup may serve now

A sample (`cache.shadow_sample`) of semantic hits is checked (systematic: at a rate of 5 %
the 20th, 40th, ... hit; served and would-be hits counted apart; deterministic, so a
handful of hits in a test never starts a shadow by chance): the model's own answer to
the question actually asked is made in the background at low priority (shadow.py) and
compared with the answer served (judge.py); with `cache.judge: questions` a chat model is
asked instead whether the two questions are the same (no answer generated). Would-be hits
that were not served (under the current threshold, barred, or semantic hits off) are
checked the same way, except that
the model answered them anyway: its answer is the judge's at no extra generation. Every
verdict goes to the ErrorBudget (error_budget.py), which moves the threshold; a wrong
hit also raises that entry's bar above the similarity it was served at (kept in the
store, so every replica sees it): that pair, and anything less alike, is never served
from that entry again. One check at a time, judged only while the engine is idle; a full
queue drops the sample (counted).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cachetools import TTLCache
from prometheus_client import Counter, Gauge

from redline.cache import judge
from redline.cache.embedder import Embedder
from redline.cache.error_budget import PERFECT, ErrorBudget, JudgeErrors
from redline.cache.shadow import ShadowGenerator
from redline.store.base import Store, StoreUnavailable
from redline.types import GenerationRequest

if TYPE_CHECKING:
    from redline.config import CacheConfig
    from redline.telemetry.metrics import Metrics
    from redline.types import Finished

log = logging.getLogger(__name__)

BAR = "rl:cache:bar:"  # entry key → the similarity a semantic hit on it needs now
BAR_MARGIN = 0.02
# a "wrong" verdict raises the entry's bar only from a judge this many times likelier to say
# it of a wrong hit than of a right one (a judge that cannot tell would bar paraphrases)
MIN_BAR_RATIO = 4.0
QUEUE = 64


@dataclass(frozen=True)
class Check:
    request: GenerationRequest
    model: str  # the model whose answer was served
    entry: str
    similarity: float
    served_text: str
    served: bool  # served to the user (else a would-be hit, answered by the model)
    fresh: str | None = None  # the model's answer, when it already made one
    asked: str = ""  # the question asked, and the cached one (for the questions judge)
    cached: str = ""


class Verifier:
    def __init__(self, cfg: CacheConfig, store: Store, generator: ShadowGenerator,
                 metrics: Metrics | None = None,
                 judges: Mapping[str, JudgeErrors] | None = None,
                 questions: judge.QuestionJudge | None = None) -> None:
        """`judges`: the judge's measured error rates on each model's answers (judge.py
        `errors_by_model`); a model not in it is taken at its word. `questions`: judge by
        asking that model whether the two questions are the same instead (`cache.judge:
        questions`)."""
        self.cfg, self.store, self.generator = cfg, store, generator
        self.judges = dict(judges or {})
        self.questions = questions
        self.budget = ErrorBudget(cfg.max_wrong_hit_rate, cfg.similarity_threshold,
                                  step=cfg.threshold_step, loosen_after=cfg.loosen_after)
        self.embedder: Embedder | None = None  # the cache's, once loaded
        self.executor: Executor | None = None  # the cache's embedding thread
        self._seen = {True: 0, False: 0}  # hits seen, served and not
        self._taken = {True: 0, False: 0}  # of which sampled
        self._pending: TTLCache[str, Check] = TTLCache(maxsize=4096, ttl=600)
        self._queue: asyncio.Queue[Check] = asyncio.Queue(maxsize=QUEUE)
        self._worker: asyncio.Task[None] | None = None
        self.verdicts = 0  # checks judged (for tests and logs)
        self._metrics(metrics)

    def _metrics(self, metrics: Metrics | None) -> None:
        self.m_hits: Counter | None = None
        self.m_verified: Counter | None = None
        self.m_wrong: Counter | None = None
        self.m_skipped: Counter | None = None
        self.m_threshold: Gauge | None = None
        self.m_rate: Gauge | None = None
        if metrics is None or not metrics.enabled:
            return
        r = metrics.registry
        self.m_hits = Counter("redline_cache_semantic_hits_total", "Semantic hits served",
                              registry=r)
        self.m_verified = Counter("redline_cache_verified_hits_total",
                                  "Semantic hits checked against the model's own answer "
                                  "(served: shadow generation; unserved: would-be hits)",
                                  ("hit",), registry=r)
        self.m_wrong = Counter("redline_cache_wrong_hits_total",
                               "Checked semantic hits whose answer disagreed", ("hit",),
                               registry=r)
        self.m_skipped = Counter("redline_cache_shadow_skipped_total",
                                 "Sampled hits not checked", ("reason",), registry=r)
        self.m_threshold = Gauge("redline_cache_semantic_threshold",
                                 "Similarity a semantic hit needs now (1 when semantic hits "
                                 "are off)", registry=r)
        self.m_rate = Gauge("redline_cache_wrong_hit_rate",
                            "Estimated share of wrong semantic hits at the current threshold, "
                            "with 95% one-sided Wilson bounds, and the budget", ("value",),
                            registry=r)
        self.m_rate.labels("budget").set(self.cfg.max_wrong_hit_rate)
        for hit in ("served", "unserved"):  # zeros from the start, for rate() and alerts
            self.m_verified.labels(hit)
            self.m_wrong.labels(hit)
        for reason in ("queue_full", "no_idle", "no_answer"):
            self.m_skipped.labels(reason)
        self._publish()

    def _publish(self) -> None:
        if self.m_threshold is None or self.m_rate is None:
            return
        b = self.budget
        self.m_threshold.set(b.threshold if b.semantic_on else 1.0)
        est = b.estimate()
        rate = est.rate if est.informative else math.nan  # no estimate from a blind judge
        for name, value in (("estimate", rate), ("lower", est.lower), ("upper", est.upper)):
            self.m_rate.labels(name).set(value)

    def summary(self) -> dict[str, float | int | bool | None]:
        """The budget as the dashboard shows it (this replica); `rate` None when the judge
        cannot tell right hits from wrong ones on these models' answers."""
        b, est = self.budget, self.budget.estimate()
        return {"budget": b.budget, "threshold": b.threshold, "semantic_on": b.semantic_on,
                "verified": est.verified, "wrong": est.wrong,
                "rate": round(est.rate, 4) if est.informative else None,
                "judge_informative": est.informative,
                "observed": round(est.observed, 4),
                "lower": round(est.lower, 4), "upper": round(est.upper, 4),
                "checks": self.verdicts}

    # -- lifecycle -------------------------------------------------------------
    def start(self, embedder: Embedder, executor: Executor) -> None:
        self.embedder, self.executor = embedder, executor
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)

    # -- what the lookup may serve ---------------------------------------------
    @property
    def threshold(self) -> float:
        return self.budget.threshold

    @property
    def semantic_on(self) -> bool:
        return self.budget.semantic_on

    async def barred(self, entry: str, similarity: float) -> bool:
        try:
            raw = await self.store.get(BAR + entry)
        except StoreUnavailable:
            return False  # fail open like the lookup itself; the threshold still holds
        return raw is not None and similarity < float(raw)

    # -- evidence ----------------------------------------------------------------
    def note(self, request: GenerationRequest, model: str, entry: str, similarity: float,
             text: str, served: bool, asked: str = "", cached: str = "") -> None:
        """`asked`, `cached`: the question asked and the cached one (as the index keeps it)."""
        if served and self.m_hits is not None:
            self.m_hits.inc()
        self._seen[served] += 1
        if self._seen[served] * self.cfg.shadow_sample >= self._taken[served] + 1 - 1e-9:
            self._taken[served] += 1
            self._pending[request.id] = Check(request, model, entry, similarity, text, served,
                                              asked=asked, cached=cached)

    def finished(self, done: Finished) -> None:
        check = self._pending.pop(done.request.id, None)
        if check is None or done.status != "200":
            return
        if not check.served:
            if done.cache != "miss" or done.finish_reason not in ("stop", "length"):
                return
            check = dataclasses.replace(check, model=done.model, fresh=done.text)
        try:
            self._queue.put_nowait(check)
        except asyncio.QueueFull:
            self._skip("queue_full")

    def _skip(self, reason: str) -> None:
        if self.m_skipped is not None:
            self.m_skipped.labels(reason).inc()

    async def _run(self) -> None:
        while True:
            check = await self._queue.get()
            try:
                await self._check(check)
            except asyncio.CancelledError:
                raise
            except Exception:  # a check must never take the cache down
                log.exception("semantic hit check failed")

    async def _check(self, check: Check) -> None:
        if self.questions is not None:
            odds = await self.generator.judge_questions(self.questions.model, check.cached,
                                                        check.asked)
            if odds is None:
                self._skip("no_answer")
                return
            await self.record(check, odds < self.questions.threshold, self.questions.errors)
            return
        fresh = check.fresh
        if fresh is None:
            fresh = await self.generator.generate(check.request, check.model)
            if fresh is None:
                self._skip("no_answer")
                return
        elif not await self.generator.wait_idle(check.model):
            self._skip("no_idle")
            return
        embedder, executor = self.embedder, self.executor
        assert embedder is not None and executor is not None  # set by start()
        agreement = self.cfg.shadow_agreement
        wrong = await asyncio.get_running_loop().run_in_executor(
            executor, lambda: judge.wrong(check.served_text, fresh, embedder, agreement))
        await self.record(check, wrong)

    async def record(self, check: Check, wrong: bool, errors: JudgeErrors | None = None) -> None:
        """`errors`: the judge's error rates (None: the answers judge's on `check.model`)."""
        self.verdicts += 1
        hit = "served" if check.served else "unserved"
        if self.m_verified is not None and self.m_wrong is not None:
            self.m_verified.labels(hit).inc()
            if wrong:
                self.m_wrong.labels(hit).inc()
        if errors is None:
            errors = self.judges.get(check.model, PERFECT)
        moved = self.budget.record(check.similarity, wrong, errors)
        if moved != "held":
            log.warning("semantic cache %s: threshold %.2f, wrong-hit rate %s", moved,
                        self.budget.threshold, self.budget.estimate())
        if wrong and errors.likelihood_ratio >= MIN_BAR_RATIO:
            await self._raise_bar(check.entry, check.similarity)
        self._publish()

    async def _raise_bar(self, entry: str, similarity: float) -> None:
        bar = similarity + BAR_MARGIN
        try:
            old = await self.store.get(BAR + entry)
            if old is not None:
                bar = max(bar, float(old))
            await self.store.set(BAR + entry, str(bar).encode(), ttl=self.cfg.ttl_s)
        except StoreUnavailable as exc:
            log.warning("entry bar not kept: %s", exc.message)
