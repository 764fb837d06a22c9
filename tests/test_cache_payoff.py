"""The semantic lookup is skipped while it would not pay on recent traffic, answers are still
stored, and the first question it would have served turns it back on
(redline/cache/payoff.py, response_cache.py)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from redline.api.app import create_app
from redline.api.services import services_of
from redline.backends.fake import FakeBackend
from redline.cache import ResponseCache
from redline.cache.embedder import HashingEmbedder
from redline.cache.payoff import LookupPayoff, upper_bound
from redline.config import CacheConfig, RedlineConfig
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
    assert upper_bound(0, 256) == pytest.approx(0.0105, abs=1e-4)  # one-sided 95 %
    assert upper_bound(0, 256) < upper_bound(1, 256) < upper_bound(2, 256) < upper_bound(2, 128)
    p = LookupPayoff()
    for _ in range(256):
        p.record(False)
    assert p.worth_it()  # no costs measured yet
    p.observe_cost(0.010)
    p.observe_answer(0.600)  # 60 lookups' time: 1.0 % of it is 6 ms < 10 ms
    assert not p.worth_it()
    p.record(True)  # one would-be hit in 256: 1.7 % of 600 ms is 10.4 ms
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
    for i in range(32):  # the fewest seen before anything is skipped (the bound: 7.8 %)
        assert await _ask(cache, _fresh(i), f"r{i}") == "miss"
    assert payoff.skipped == 0 and len(embedder.texts) == 32  # each embedded once
    req = _greedy(_fresh(32), "r32")
    looked = await cache.lookup(req)
    assert looked.result == "miss" and payoff.skipped == 1
    assert len(embedder.texts) == 32  # nothing embedded before its first token
    cache.on_finish(Finished(req, "m", "A", "miss", "200", "stop", 3, 0.01, 0.1, Usage(5, 3),
                             "answer 32", {"total": 0.1}))
    await asyncio.gather(*list(cache._tasks))
    assert embedder.texts[-1] == _fresh(32) and len(payoff.outcomes) == 33  # searched on store
    assert await _ask(cache, _fresh(32), "again") == "hit"  # its answer was stored all the same
    # a paraphrase while skipping: it misses, and tells that it would have been served
    assert await _ask(cache, "How do I change my email address?", "p0") == "miss"
    assert await _ask(cache, "how do i change my email address", "p1") == "miss"
    assert payoff.skipped == 3 and list(payoff.outcomes)[-2:] == [False, True]
    assert payoff.worth_it()  # 1 in 35: the bound is back over 10 % (11.8 %)
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


def test_the_dashboard_and_metrics_show_the_skipped_lookups(tmp_path: Path) -> None:
    """Through the API: a skipped lookup is a miss to the client (the model answered), a
    `skipped` lookup in /metrics, and /v1/admin/stats (the dashboard) says why."""
    cfg = RedlineConfig(server={"data_dir": str(tmp_path)}, store={"url": "memory://"},
                        cache={"similarity_threshold": 0.8})
    app = create_app(cfg, backends={"fake": FakeBackend()})
    cache = services_of(app).pipeline.cache
    assert cache is not None
    cache.embedder = HashingEmbedder()  # no torch here
    with TestClient(app) as client:
        deadline = time.monotonic() + 30
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert client.get("/v1/admin/stats").json()["cache_lookup"]["looking_up"] is True
        cache.payoff = Fixed(cost=0.010, saving=0.100)
        heads = []
        for i in range(34):
            r = client.post("/v1/chat/completions", json={
                "model": "fake", "temperature": 0, "max_tokens": 4,
                "messages": [{"role": "user", "content": _fresh(i)}]})
            assert r.status_code == 200, r.text
            heads.append(r.headers["x-redline-cache"])
        assert heads == ["miss"] * 34
        deadline = time.monotonic() + 10
        while len(cache.payoff.outcomes) < 34:  # the last answers are stored after they end
            assert time.monotonic() < deadline
            time.sleep(0.02)
        shown = client.get("/v1/admin/stats").json()["cache_lookup"]
        assert shown["looking_up"] is False and shown["skipped"] == 2
        assert shown["seen"] == 34 and shown["would_serve"] == 0
        assert shown["lookup_ms"] == 10.0 and shown["answer_ms"] == 100.0
        assert 'redline_cache_lookups_total{result="skipped"} 2.0' in client.get("/metrics").text
