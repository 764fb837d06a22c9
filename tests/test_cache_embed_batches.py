"""The semantic cache embeds the questions that arrive while its embed thread is busy
together, in its next pass (redline/cache/response_cache.py `embed`)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from redline.cache import ResponseCache
from redline.cache.embedder import HashingEmbedder
from redline.cache.response_cache import _by_length
from redline.config import CacheConfig
from redline.store.memory import MemoryStore


class Gated(HashingEmbedder):
    """Blocks each pass until the test lets it go; records every pass's texts."""

    def __init__(self) -> None:
        super().__init__()
        self.passes: list[list[str]] = []
        self.entered = threading.Event()
        self.go = threading.Event()

    def encode(self, texts: list[str]) -> np.ndarray:
        self.passes.append(list(texts))
        self.entered.set()
        assert self.go.wait(5)
        if any("boom" in t for t in texts):
            raise RuntimeError("the embedder failed")
        return super().encode(texts)


async def _cache(cfg: CacheConfig | None = None) -> tuple[ResponseCache, Gated]:
    embedder = Gated()
    cache = ResponseCache(cfg or CacheConfig(), MemoryStore(), embedder=embedder)
    await cache.start()
    return cache, embedder


async def _busy(cache: ResponseCache, embedder: Gated) -> asyncio.Task[np.ndarray]:
    """A first question in a pass that holds the embed thread until `go`."""
    first = asyncio.create_task(cache.embed("what are your opening hours?"))
    await asyncio.to_thread(embedder.entered.wait, 5)
    return first


QUESTIONS = ["where is my order?", "how do I reset my password?", "can I pay by card?",
             "do you ship to Norway?"]


LONG = ("a question of a very different length from the bad one, so that it goes in a pass "
        "of its own after it")


def _alone(text: str) -> np.ndarray:
    return HashingEmbedder().encode([text])[0]


async def test_questions_that_wait_go_in_one_pass_and_get_their_own_vectors() -> None:
    cache, embedder = await _cache()
    first = await _busy(cache, embedder)
    rest = [asyncio.create_task(cache.embed(q)) for q in QUESTIONS]
    await asyncio.sleep(0.01)
    embedder.go.set()
    vectors = await asyncio.gather(first, *rest)
    assert embedder.passes == [["what are your opening hours?"], sorted(QUESTIONS, key=len)]
    for q, v in zip(["what are your opening hours?", *QUESTIONS], vectors, strict=True):
        assert np.array_equal(v, _alone(q))
        assert v.dtype == np.float32
    await cache.close()


async def test_embed_batch_bounds_a_pass() -> None:
    cache, embedder = await _cache(CacheConfig(embed_batch=1))
    first = await _busy(cache, embedder)
    rest = [asyncio.create_task(cache.embed(q)) for q in QUESTIONS[:2]]
    await asyncio.sleep(0.01)
    embedder.go.set()
    await asyncio.gather(first, *rest)
    assert embedder.passes == [["what are your opening hours?"], [QUESTIONS[0]], [QUESTIONS[1]]]
    await cache.close()


async def test_a_question_that_left_does_not_hold_the_others() -> None:
    cache, embedder = await _cache()
    first = await _busy(cache, embedder)
    gone = asyncio.create_task(cache.embed(QUESTIONS[0]))
    stays = asyncio.create_task(cache.embed(QUESTIONS[1]))
    await asyncio.sleep(0.01)
    gone.cancel()  # its client went away while it waited
    embedder.go.set()
    await first
    assert np.array_equal(await stays, _alone(QUESTIONS[1]))
    assert gone.cancelled()
    assert embedder.passes[1] == [QUESTIONS[1]]
    await cache.close()


async def test_an_embedder_error_reaches_the_questions_of_its_pass_only() -> None:
    cache, embedder = await _cache()
    first = await _busy(cache, embedder)
    bad = asyncio.create_task(cache.embed("boom: a question the model cannot take"))
    good = asyncio.create_task(cache.embed(LONG))
    await asyncio.sleep(0.01)
    embedder.go.set()
    await first
    with pytest.raises(RuntimeError, match="the embedder failed"):
        await bad
    assert np.array_equal(await good, _alone(LONG))
    assert len(embedder.passes) == 3
    await cache.close()


def test_texts_of_very_different_lengths_go_in_different_passes() -> None:
    items = [("a" * 40, 1), ("b" * 10, 2), ("c" * 18, 3), ("d" * 300, 4), ("e" * 21, 5)]
    parts = _by_length(items)
    assert [[n for _, n in part] for part in parts] == [[2, 3], [5, 1], [4]]
    assert _by_length([]) == []
