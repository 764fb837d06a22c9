"""The response cache: exact lookup, then semantic lookup, over any `Store`.

    lookup(request, model) → Lookup(result="hit"|"semantic"|"miss"|"bypass", chunks)
    on_finish(completion)   → stores a fresh answer (a pipeline Observer)

Exact: one store `get` by a hash of everything that shapes the answer (see keys.py).
Semantic (chat only): embed the last user message off the event loop, search the
partition's vectors (index.py), then serve the best candidate over the threshold that
the near-miss guard (guard.py) lets through; a candidate a little under it (from
`confirm_floor`) is served only when a stronger embedder confirms it (confirm.py).
Store failures fail open (a miss). While the semantic lookup would not pay on recent
traffic (payoff.py: the share it would serve times a miss's answer time, against its
embedding's time) it is skipped (`semantic_skip`); the answer is still stored, and its
question searched then, off the first token's path, to keep that share measured.
With backends given, the error budget (verify.py) checks a sample of semantic hits on
live traffic and moves the threshold (never below the configured one) and per-entry bars.

Only greedy requests (temperature 0) are cached unless `cache_sampled` is on: a
sampled answer is one draw among many, and replaying it changes what the user asked
for. Eviction: answers expire after `ttl_s`, and a ring of `max_entries` slots in the
store (a shared counter) drops the oldest answer when a new one arrives, on every
store kind and across replicas.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from cachetools import TTLCache
from prometheus_client import Histogram

from redline.cache import guard
from redline.cache.confirm import Confirmer
from redline.cache.confirm import load_model as load_confirm_model
from redline.cache.embedder import Embedder, load_minilm, resolve_dtype
from redline.cache.error_budget import JudgeErrors
from redline.cache.index import SemanticIndex
from redline.cache.judge import QuestionJudge
from redline.cache.keys import CacheKeys, cache_keys
from redline.cache.payoff import LookupPayoff
from redline.cache.shadow import ShadowGenerator
from redline.cache.verify import Verifier
from redline.store.base import Store, StoreUnavailable
from redline.types import Chunk, GenerationRequest, Usage

if TYPE_CHECKING:
    from redline.backends.base import Backend
    from redline.config import CacheConfig
    from redline.telemetry.metrics import Metrics
    from redline.types import Finished

log = logging.getLogger(__name__)
T = TypeVar("T")

ENTRY = "rl:cache:e:"  # answer records, by exact key
RING = "rl:cache:ring:"  # eviction slots → answer key
SEQ = "rl:cache:seq"  # the ring's write counter
CANDIDATES = 4  # semantic candidates checked by the guard, best first
REPLAY_CHUNKS = 4


@dataclass(frozen=True)
class CachedAnswer:
    model: str  # the model that answered
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    question: str | None
    created: float

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__, ensure_ascii=False).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> CachedAnswer:
        return cls(**json.loads(raw))

    def chunks(self, n: int = REPLAY_CHUNKS) -> list[Chunk]:
        """The answer as a few chunks split at spaces, tokens spread over them; the last
        one carries finish_reason and usage, as a backend's would."""
        words = self.text.split(" ")
        step = max(1, -(-len(words) // n))
        pieces = [" ".join(words[i:i + step]) for i in range(0, len(words), step)] or [""]
        pieces = [p + (" " if i < len(pieces) - 1 else "") for i, p in enumerate(pieces)]
        per = self.completion_tokens // len(pieces)
        out = [Chunk(text=p, tokens=per) for p in pieces]
        last = out[-1]
        last.tokens = self.completion_tokens - per * (len(pieces) - 1)
        last.finish_reason = "length" if self.finish_reason == "length" else "stop"
        last.usage = Usage(self.prompt_tokens, self.completion_tokens)
        return out


@dataclass
class Lookup:
    result: str  # hit | semantic | miss | bypass (client asked) | sampled | skipped | error
    seconds: float = 0.0
    answer: CachedAnswer | None = None
    similarity: float | None = None


def accepts(cfg: CacheConfig, question: str, candidate: str, similarity: float,
            confirmed: float | None = None) -> bool:
    """The one rule for a semantic hit (`redline eval-cache` measures exactly this).
    `similarity`: the search embedder's cosine; `confirmed`: the stronger embedder's, for a
    borderline candidate (None: not checked, as without the second model)."""
    if similarity < cfg.similarity_threshold and not (
            borderline(cfg, similarity) and confirmed is not None
            and confirmed >= cfg.confirm_threshold):
        return False
    return not cfg.guard or guard.allows(question, candidate, similarity)


def borderline(cfg: CacheConfig, similarity: float) -> bool:
    """Under the threshold, but close enough for the stronger embedder to decide."""
    return cfg.confirm and cfg.confirm_floor <= similarity < cfg.similarity_threshold


class ResponseCache:
    def __init__(self, cfg: CacheConfig, store: Store, metrics: Metrics | None = None,
                 embedder: Embedder | None = None, embedder_threads: int = 1,
                 backends: Mapping[str, Backend] | None = None,
                 confirm_embedder: Embedder | None = None,
                 judges: Mapping[str, JudgeErrors] | None = None,
                 questions: QuestionJudge | None = None) -> None:
        """`backends`: the models whose answers a semantic hit is checked against (the
        error budget); without them the threshold stays as configured.
        `confirm_embedder`: the borderline check's model (None: load the configured one,
        unless `embedder` is given: then there is no check)."""
        self.cfg = cfg
        self.embedder_threads = embedder_threads  # torch's (0: its default); see api/app.py
        self.store = store
        self.metrics = metrics
        self.embedder: Embedder | None = embedder
        self.index: SemanticIndex | None = None
        self.confirm_embedder = confirm_embedder
        self.confirmer: Confirmer | None = None  # set by start() when the model is there
        # the embedder runs on its own thread, off the event loop, one pass at a time; the
        # questions that arrive during a pass wait for the next and go in it together
        self._embed_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cache-embed")
        self._waiting: list[tuple[str, asyncio.Future[np.ndarray]]] = []
        self._draining = False
        # a miss's question vector, kept until its answer is stored (so it is embedded once)
        self._vectors: TTLCache[str, np.ndarray] = TTLCache(maxsize=4096, ttl=600)
        self._tasks: set[asyncio.Task[None]] = set()
        self.payoff = LookupPayoff() if cfg.semantic_skip else None
        self.verifier: Verifier | None = None
        if backends is not None and cfg.semantic:
            self.verifier = Verifier(cfg, store, ShadowGenerator(backends), metrics, judges,
                                     questions)
        self.lookup_seconds: Histogram | None = None
        if metrics is not None and metrics.enabled:  # off: no-op metrics, nothing to add
            self.lookup_seconds = Histogram(
                "redline_cache_lookup_seconds", "Response cache lookup time, by result",
                ("result",), buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03,
                                      0.05, 0.1, 0.25), registry=metrics.registry)

    # -- lifecycle -------------------------------------------------------------
    async def start(self) -> None:
        """Load the embedder off the event loop. Without it the cache is exact-only."""
        if not self.cfg.semantic:
            return
        given = self.embedder is not None  # injected (tests, benchmarks): so is the check's
        if self.embedder is None:
            try:
                path, threads = self.cfg.embedder_path, self.embedder_threads
                dtype = resolve_dtype(self.cfg.embedder_dtype)
                self.embedder = await self._off_loop(
                    lambda: load_minilm(path, threads, dtype, traced=True))
            except Exception:
                log.exception("semantic cache off: the embedder did not load")
                return
        self.index = SemanticIndex(self.store, self.embedder.dim, max_entries=self.cfg.max_entries)
        if self.cfg.confirm and (self.confirm_embedder is not None or not given):
            await self._start_confirmer()
        if self.verifier is not None:
            self.verifier.start(self.embedder, self._embed_pool)

    async def _start_confirmer(self) -> None:
        if self.confirm_embedder is None:
            cfg, threads = self.cfg, self.embedder_threads
            self.confirm_embedder = await self._off_loop(lambda: load_confirm_model(cfg, threads))
        if self.confirm_embedder is not None:
            self.confirmer = Confirmer(self.confirm_embedder, self.store, self._embed_pool,
                                       self.cfg.ttl_s)

    async def close(self) -> None:
        if self.verifier is not None:
            await self.verifier.close()
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self.confirmer is not None:
            self.confirmer.close()
        self._embed_pool.shutdown(wait=False, cancel_futures=True)

    async def _off_loop(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._embed_pool, fn)

    async def embed(self, text: str) -> np.ndarray:
        """The question's vector. Questions that come while the embed thread is busy are
        embedded together in its next pass: four short questions take ~23 ms of a core
        in one BF16 pass, ~44 one at a time (docs/BENCHMARKS.md). Its wall time, the wait
        for a pass included, is what a lookup costs (`payoff`)."""
        if self.embedder is None:
            raise RuntimeError("no embedder")
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[np.ndarray] = loop.create_future()
        self._waiting.append((text, done))
        if not self._draining:
            self._draining = True
            task = loop.create_task(self._drain(self.embedder))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        vector = await done
        if self.payoff is not None:
            self.payoff.observe_cost(time.perf_counter() - t0)
        return vector

    async def _drain(self, embedder: Embedder) -> None:
        batch: list[tuple[str, asyncio.Future[np.ndarray]]] = []
        try:
            while self._waiting:
                most = self.cfg.embed_batch
                batch = [(t, f) for t, f in self._waiting[:most] if not f.done()]
                del self._waiting[:most]
                for part in _by_length(batch):
                    texts = [t for t, _ in part]
                    try:
                        rows = await self._off_loop(functools.partial(embedder.encode, texts))
                    except Exception as exc:  # each waiting lookup raises it, as alone
                        for _, f in part:
                            if not f.done():
                                f.set_exception(exc)
                        continue
                    for (_, f), row in zip(part, rows, strict=True):
                        if not f.done():  # its request may have gone meanwhile
                            f.set_result(np.asarray(row, dtype=np.float32))
        except asyncio.CancelledError:  # the cache is closing: nobody is left waiting
            for _, f in batch + self._waiting:
                f.cancel()
            self._waiting.clear()
            raise
        finally:
            self._draining = False

    # -- policy ----------------------------------------------------------------
    def cacheable(self, request: GenerationRequest) -> bool:
        return request.use_cache and (request.sampling.greedy or self.cfg.cache_sampled)

    def accepts(self, question: str, candidate: str, similarity: float,
                confirmed: float | None = None) -> bool:
        return accepts(self.cfg, question, candidate, similarity, confirmed)

    # -- lookup ----------------------------------------------------------------
    async def lookup(self, request: GenerationRequest) -> Lookup:
        """Keyed on the model the client named (`auto` included): the router's choice
        comes after the cache, and the same question to `auto` gets the same answer."""
        t0 = time.perf_counter()
        if not request.use_cache:
            out = Lookup("bypass")
        elif not self.cacheable(request):
            out = Lookup("sampled")  # not looked up, not stored: one draw among many
        else:
            try:
                out = await self._lookup(request, cache_keys(request, request.model))
            except StoreUnavailable as exc:  # fail open: the model answers
                log.warning("cache lookup skipped: %s", exc.message)
                out = Lookup("error")
        out.seconds = time.perf_counter() - t0
        if self.metrics is not None:
            self.metrics.cache_lookups.labels(out.result).inc()
        if self.lookup_seconds is not None and out.result not in ("bypass", "sampled"):
            self.lookup_seconds.labels(out.result).observe(out.seconds)
        if out.result in ("error", "sampled", "skipped"):
            out.result = "miss"  # what the client sees (X-Redline-Cache): the model answered
        return out

    async def _lookup(self, request: GenerationRequest, keys: CacheKeys) -> Lookup:
        raw = await self.store.get(ENTRY + keys.exact)
        if raw is not None:
            return Lookup("hit", answer=CachedAnswer.from_bytes(raw))
        if self.index is None or keys.partition is None or keys.question is None:
            return Lookup("miss")
        payoff = self.payoff
        if payoff is not None and not payoff.worth_it():
            payoff.skipped += 1
            return Lookup("skipped")  # its question is searched when its answer is stored
        vector = await self.embed(keys.question)
        self._vectors[request.id] = vector
        out = await self._semantic(request, keys, vector)
        if payoff is not None:
            payoff.record(out.result == "semantic" or out.similarity is not None)
        return out

    async def _semantic(self, request: GenerationRequest, keys: CacheKeys,
                        vector: np.ndarray) -> Lookup:
        """The best candidate the rules serve, else a miss; a miss whose best candidate
        passed the rules but was not served (the error budget holds it back) carries its
        similarity."""
        assert self.index is not None and keys.partition is not None and keys.question is not None
        verifier = self.verifier
        floor = self._floor()
        strong: np.ndarray | None = None  # the question in the stronger model, made once
        would: tuple[str, float, CachedAnswer, str] | None = None  # the best hit not served
        for cand in await self.index.search(keys.partition, vector, CANDIDATES):
            if cand.similarity < floor:
                break
            confirmed: float | None = None
            if cand.similarity < self.cfg.similarity_threshold:  # borderline
                if self.confirmer is None or (self.cfg.guard and not guard.allows(
                        keys.question, cand.question, cand.similarity)):
                    continue  # the guard first: it is cheaper than the second embedding
                if strong is None:
                    strong = await self.confirmer.embed_question(keys.question)
                confirmed = await self.confirmer.similarity(strong, cand.key, cand.question)
            if not self.accepts(keys.question, cand.question, cand.similarity, confirmed):
                continue
            raw = await self.store.get(ENTRY + cand.key)
            if raw is None:  # evicted or expired: try the next one
                continue
            answer = CachedAnswer.from_bytes(raw)
            # the error budget counts a confirmed hit at the configured threshold (the rule
            # that served it); it serves confirmed hits only while it holds at that floor
            counted = max(cand.similarity, self.cfg.similarity_threshold)
            if verifier is not None and (
                    not verifier.semantic_on or counted < verifier.threshold
                    or await verifier.barred(cand.key, counted)):
                would = would or (cand.key, counted, answer, cand.question)
                continue
            if verifier is not None:
                verifier.note(request, answer.model, cand.key, counted, answer.text, True,
                              keys.question, cand.question)
            return Lookup("semantic", answer=answer, similarity=cand.similarity)
        if verifier is not None and would is not None:
            key, similarity, answer, cached = would
            verifier.note(request, answer.model, key, similarity, answer.text, False,
                          keys.question, cached)
            return Lookup("miss", similarity=similarity)
        return Lookup("miss")

    def _floor(self) -> float:
        """The lowest similarity a candidate may have to be looked at now."""
        cfg, verifier = self.cfg, self.verifier
        if self.confirmer is None or not cfg.confirm or (verifier is not None and (
                not verifier.semantic_on or verifier.threshold > cfg.similarity_threshold)):
            return cfg.similarity_threshold  # no second opinion, or the budget has tightened
        return min(cfg.confirm_floor, cfg.similarity_threshold)

    # -- store -----------------------------------------------------------------
    def on_finish(self, completion: Finished) -> None:
        """Observer: store an answer that was looked up, missed, and finished well."""
        req = completion.request
        if self.verifier is not None:
            self.verifier.finished(completion)
        cut_short = completion.finish_reason == "length" and \
            completion.output_tokens < req.sampling.max_tokens  # e.g. the router shortened it
        if completion.cache != "miss" or not self.cacheable(req) or completion.status != "200" \
                or cut_short or completion.finish_reason not in ("stop", "length"):
            self._vectors.pop(req.id, None)
            return
        if self.payoff is not None:  # what a hit would have saved this question
            self.payoff.observe_answer(completion.total_s)
        usage = completion.usage
        answer = CachedAnswer(completion.model, completion.text, completion.finish_reason,
                              usage.prompt_tokens if usage else 0,
                              usage.completion_tokens if usage else completion.output_tokens,
                              None, time.time())
        task = asyncio.get_running_loop().create_task(self.put(req, answer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def put(self, request: GenerationRequest, answer: CachedAnswer) -> None:
        keys = cache_keys(request, request.model)
        vector = self._vectors.pop(request.id, None)
        try:
            answer = CachedAnswer(**{**answer.__dict__, "question": keys.question})
            entry = ENTRY + keys.exact
            await self.store.set(entry, answer.to_bytes(), ttl=self.cfg.ttl_s)
            await self._evict_oldest(entry)
            if self.index is not None and keys.partition is not None and keys.question is not None:
                if vector is None:  # not looked up (skipped): would it have been served?
                    vector = await self.embed(keys.question)
                    if self.payoff is not None:
                        self.payoff.record(await self._would_serve(keys, vector))
                await self.index.add(keys.partition, keys.exact, keys.question, vector,
                                     ttl=self.cfg.ttl_s)
                if self.confirmer is not None:
                    await self.confirmer.remember(keys.exact, keys.question)
        except StoreUnavailable as exc:
            log.warning("answer not cached: %s", exc.message)
        except Exception:  # a background write must never take anything down
            log.exception("answer not cached")

    async def _would_serve(self, keys: CacheKeys, vector: np.ndarray) -> bool:
        """Whether a lookup would have found a candidate the rules serve (the threshold
        and the guard; the borderline check and the error budget aside)."""
        assert self.index is not None and keys.partition is not None and keys.question is not None
        for cand in await self.index.search(keys.partition, vector, CANDIDATES):
            if cand.similarity < self.cfg.similarity_threshold:
                return False
            if self.accepts(keys.question, cand.question, cand.similarity):
                return True
        return False

    async def _evict_oldest(self, entry: str) -> None:
        slot = RING + str((await self.store.incr(SEQ) - 1) % self.cfg.max_entries)
        old = await self.store.get(slot)
        if old is not None and old.decode() != entry:
            await self.store.delete(old.decode())
            if self.confirmer is not None:
                await self.confirmer.forget(old.decode().removeprefix(ENTRY))
        await self.store.set(slot, entry.encode(), ttl=self.cfg.ttl_s)


def _by_length(batch: list[tuple[str, T]]) -> list[list[tuple[str, T]]]:
    """A pass pads every text to its longest: texts within 2x of each other's length go
    together, each longer run in a pass of its own."""
    parts: list[list[tuple[str, T]]] = []
    for item in sorted(batch, key=lambda it: len(it[0])):
        if parts and len(item[0]) <= 2 * max(1, len(parts[-1][0][0])):
            parts[-1].append(item)
        else:
            parts.append([item])
    return parts
