"""The semantic lookup is skipped while it would not pay on recent traffic, answers are still
stored, and the first question it would have served turns it back on
(redline/cache/payoff.py, response_cache.py)."""

from __future__ import annotations

import asyncio
import hashlib

import numpy as np
import pytest

from redline.cache import ResponseCache
from redline.cache.embedder import HashingEmbedder
from redline.cache.payoff import LookupPayoff, upper_bound
from redline.config import CacheConfig
from redline.store.memory import MemoryStore
from redline.types import Finished, GenerationRequest, Message, SamplingParams, Usage


class Counting(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def encode(self, texts: list[str]) -> np.ndarray:
        self.texts.extend(texts)
        return super().encode(texts)


class Fixed(LookupPayoff):
    """A lookup costs `cost` s and a miss's answer takes `saving` s, whatever is measured."""

    def __init__(self, cost: float, saving: float) -> None:
        super().__init__()
        self.cost_s, self.saving_s = cost, saving

    def observe_cost(self, seconds: float) -> None:
        pass

    def observe_answer(self, seconds: float) -> None:
        pass


def _greedy(text: str, rid: str) -> GenerationRequest:
    return GenerationRequest(model="m", id=rid, sampling=SamplingParams(temperature=0, max_tokens=4),
                             messages=(Message("user", text),))


def _fresh(i: int) -> str:
    return hashlib.sha1(str(i).encode()).hexdigest()  # no two alike


async def _ask(cache: ResponseCache, text: str, rid: str, total_s: float = 0.1) -> str:
    """Look `text` up; on a miss the model answers in `total_s` and the answer is stored."""
    req = _greedy(text, rid)
    result = (await cache.lookup(req)).result
    if result == "miss":
        cache.on_finish(Finished(req, "m", "A", "miss", "200", "stop", 3, 0.01, total_s,
                                 Usage(5, 3), f"answer to {text}", {"total": total_s}))
        await asyncio.gather(*list(cache._tasks))
    return result


def test_the_bound_and_when_a_lookup_pays() -> None:
    assert upper_bound(0, 0) == 1.0
    assert upper_bound(0, 256) == pytest.approx(0.0148, abs=1e-4)
    assert upper_bound(0, 256) < upper_bound(1, 256) < upper_bound(2, 256) < upper_bound(2, 128)
    p = LookupPayoff()
    for _ in range(256):
        p.record(False)
    assert p.worth_it()  # no costs measured yet
    p.observe_cost(0.010)
    p.observe_answer(0.600)  # 60 lookups' time: 1.5 % of it is 9 ms < 10 ms
    assert not p.worth_it()
    p.record(True)  # one would-be hit: 2.2 % of 600 ms is 13 ms
    assert p.worth_it()
    q = LookupPayoff()
    q.observe_cost(0.010)
    q.observe_answer(0.020)
    for _ in range(q.min_seen - 1):
        q.record(False)
    assert q.worth_it()  # too few seen
    q.record(False)
    assert not q.worth_it()


async def test_fresh_questions_stop_the_lookups_and_a_would_be_hit_restarts_them() -> None:
    embedder = Counting()
    cache = ResponseCache(CacheConfig(similarity_threshold=0.8), MemoryStore(), embedder=embedder)
    await cache.start()
    payoff = cache.payoff = Fixed(cost=0.010, saving=0.100)  # skipped below a 10 % share
    for i in range(35):  # 3.84 / (n + 3.84) >= 0.1 until n = 35 misses
        assert await _ask(cache, _fresh(i), f"r{i}") == "miss"
    assert payoff.skipped == 0 and len(embedder.texts) == 35  # each embedded once
    req = _greedy(_fresh(35), "r35")
    looked = await cache.lookup(req)
    assert looked.result == "miss" and payoff.skipped == 1
    assert len(embedder.texts) == 35  # nothing embedded before its first token
    cache.on_finish(Finished(req, "m", "A", "miss", "200", "stop", 3, 0.01, 0.1, Usage(5, 3),
                             "answer 35", {"total": 0.1}))
    await asyncio.gather(*list(cache._tasks))
    assert embedder.texts[-1] == _fresh(35) and len(payoff.outcomes) == 36  # searched on store
    assert await _ask(cache, _fresh(35), "again") == "hit"  # its answer was stored all the same
    # a paraphrase while skipping: it misses, and tells that it would have been served
    assert await _ask(cache, "How do I change my email address?", "p0") == "miss"
    assert await _ask(cache, "how do i change my email address", "p1") == "miss"
    assert payoff.skipped == 3 and list(payoff.outcomes)[-2:] == [False, True]
    assert payoff.worth_it()  # 1 in 38: the bound is back over 10 %
    assert await _ask(cache, "HOW do I change my email address", "p2") == "semantic"
    await cache.close()


async def test_semantic_skip_off_looks_up_every_question() -> None:
    embedder = Counting()
    cache = ResponseCache(CacheConfig(similarity_threshold=0.8, semantic_skip=False), MemoryStore(),
                          embedder=embedder)
    await cache.start()
    assert cache.payoff is None
    for i in range(60):
        assert await _ask(cache, _fresh(i), f"r{i}", total_s=0.0001) == "miss"
    assert len(embedder.texts) == 60
    await cache.close()


async def test_a_lookup_and_an_answer_are_measured() -> None:
    cache = ResponseCache(CacheConfig(), MemoryStore(), embedder=HashingEmbedder())
    await cache.start()
    payoff = cache.payoff
    assert payoff is not None and not payoff.outcomes
    await _ask(cache, "where is my parcel?", "r0", total_s=0.25)
    assert payoff.cost_s is not None and payoff.cost_s > 0
    assert payoff.saving_s == pytest.approx(0.25)
    assert list(payoff.outcomes) == [False]
    await cache.close()
