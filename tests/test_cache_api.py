"""The response cache through the in-process app on the fake backend: hits served as
normal completions (JSON and SSE), headers, bypass, sampling, tenants, the index."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from redline.api.app import create_app
from redline.api.services import services_of
from redline.backends.fake import FakeBackend
from redline.cache import ResponseCache
from redline.cache.embedder import HashingEmbedder
from redline.config import CacheConfig, RedlineConfig
from redline.store.memory import MemoryStore
from redline.types import GenerationRequest, Message, SamplingParams


def make_app(tmp_path: Path, store_url: str | None = "memory://",
             **cache: Any) -> tuple[Any, FakeBackend]:
    cfg = RedlineConfig(server={"data_dir": str(tmp_path)}, store={"url": store_url},
                        cache={"similarity_threshold": 0.8, **cache})
    backend = FakeBackend(words=("the", "answer", "is", "here"))
    app = create_app(cfg, backends={"fake": backend})
    services_of(app).pipeline.cache.embedder = HashingEmbedder()  # no torch in these tests
    return app, backend


def ready(client: TestClient) -> TestClient:
    deadline = time.monotonic() + 30
    while client.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return client


@pytest.fixture
def app_client(tmp_path: Path) -> Iterator[tuple[TestClient, FakeBackend]]:
    app, backend = make_app(tmp_path)
    with TestClient(app) as client:
        yield ready(client), backend


def ask(client: TestClient, text: str, *, headers: dict[str, str] | None = None,
        **body: Any) -> Any:
    payload = {"model": "fake", "temperature": 0, "max_tokens": 6,
               "messages": [{"role": "user", "content": text}], **body}
    r = client.post("/v1/chat/completions", json=payload, headers=headers or {})
    assert r.status_code == 200, r.text
    return r


def settle(client: TestClient) -> None:
    """Answers are stored in the background after the response; wait for that."""
    cache = services_of(client.app).pipeline.cache
    deadline = time.monotonic() + 5
    while cache._tasks and time.monotonic() < deadline:
        time.sleep(0.01)


def test_miss_then_exact_hit_serves_the_same_completion(app_client: Any) -> None:
    client, backend = app_client
    first = ask(client, "How do I reset my password?")
    assert first.headers["x-redline-cache"] == "miss"
    assert "cache;dur=" in first.headers["server-timing"]
    settle(client)
    second = ask(client, "How do I reset my password?")
    assert second.headers["x-redline-cache"] == "hit"
    assert second.headers["server-timing"].startswith("cache;dur=")
    assert backend.calls == 1
    a, b = first.json(), second.json()
    assert b["choices"][0]["message"]["content"] == a["choices"][0]["message"]["content"]
    assert b["choices"][0]["finish_reason"] == a["choices"][0]["finish_reason"] == "length"
    assert b["usage"] == a["usage"]
    assert b["object"] == "chat.completion" and b["model"] == "fake"


def test_hit_streams_as_sse_with_usage(app_client: Any) -> None:
    client, backend = app_client
    full = ask(client, "Tell me a fact").json()["choices"][0]["message"]["content"]
    settle(client)
    payload = {"model": "fake", "temperature": 0, "max_tokens": 6, "stream": True,
               "stream_options": {"include_usage": True},
               "messages": [{"role": "user", "content": "Tell me a fact"}]}
    with client.stream("POST", "/v1/chat/completions", json=payload) as r:
        assert r.headers["x-redline-cache"] == "hit"
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == full
    assert len([c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]) > 1
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    assert backend.calls == 1


def test_semantic_hit_and_near_miss(app_client: Any) -> None:
    client, backend = app_client
    ask(client, "Where is my order 1042 right now?")
    settle(client)
    r = ask(client, "where is my order 1042 right now")
    assert r.headers["x-redline-cache"] == "semantic"
    r = ask(client, "Where is my order 2977 right now?")  # similar, but another order
    assert r.headers["x-redline-cache"] == "miss"
    assert backend.calls == 2


def test_bypass_by_header_body_and_sampling(app_client: Any) -> None:
    client, backend = app_client
    ask(client, "Hello")
    settle(client)
    assert ask(client, "Hello", headers={"Cache-Control": "no-cache"}).headers["x-redline-cache"] == "bypass"
    assert ask(client, "Hello", cache=False).headers["x-redline-cache"] == "bypass"
    # sampled: not looked up and not stored (the header says the model answered)
    assert ask(client, "Hello", temperature=0.7).headers["x-redline-cache"] == "miss"
    settle(client)
    assert ask(client, "Hello", temperature=0.7).headers["x-redline-cache"] == "miss"
    assert ask(client, "Hello").headers["x-redline-cache"] == "hit"
    assert backend.calls == 5
    metrics = client.get("/metrics").text
    assert 'redline_cache_lookups_total{result="sampled"} 2.0' in metrics
    assert 'redline_cache_lookups_total{result="bypass"} 2.0' in metrics


def test_sampled_requests_cached_when_configured(tmp_path: Path) -> None:
    app, backend = make_app(tmp_path, cache_sampled=True)
    with TestClient(app) as client:
        ready(client)
        ask(client, "Write a haiku", temperature=0.9)
        settle(client)
        assert ask(client, "Write a haiku", temperature=0.9).headers["x-redline-cache"] == "hit"
        assert ask(client, "Write a haiku", temperature=0.5).headers["x-redline-cache"] == "miss"


def test_tenants_never_share_answers(app_client: Any) -> None:
    client, backend = app_client
    alice = {"Authorization": "Bearer sk-alice"}
    bob = {"Authorization": "Bearer sk-bob"}
    ask(client, "What is my balance?", headers=alice)
    settle(client)
    assert ask(client, "What is my balance?", headers=alice).headers["x-redline-cache"] == "hit"
    assert ask(client, "What is my balance?", headers=bob).headers["x-redline-cache"] == "miss"
    assert backend.calls == 2
    # a paraphrase from a third tenant: neither alice's nor bob's answer, exact or similar
    carol = {"Authorization": "Bearer sk-carol"}
    assert ask(client, "what is my balance", headers=carol).headers["x-redline-cache"] == "miss"
    assert backend.calls == 3
    settle(client)
    # bob's paraphrase is served, from his own partition (so the paraphrase can hit at all)
    assert ask(client, "what is my balance", headers=bob).headers["x-redline-cache"] in ("hit", "semantic")
    assert backend.calls == 3
    assert ask(client, "What is my balance?").headers["x-redline-cache"] == "miss"  # anonymous


def test_metrics_count_lookups_and_hit_latency(app_client: Any) -> None:
    client, _ = app_client
    ask(client, "Metrics please")
    settle(client)
    ask(client, "Metrics please")
    text = client.get("/metrics").text
    assert 'redline_cache_lookups_total{result="hit"} 1.0' in text
    assert 'redline_cache_lookups_total{result="miss"} 1.0' in text
    assert 'redline_cache_lookup_seconds_count{result="hit"} 1.0' in text


def test_text_completions_are_cached_exactly(app_client: Any) -> None:
    client, backend = app_client
    body = {"model": "fake", "prompt": "Once upon a time", "temperature": 0, "max_tokens": 4}
    assert client.post("/v1/completions", json=body).headers["x-redline-cache"] == "miss"
    settle(client)
    r = client.post("/v1/completions", json=body)
    assert r.headers["x-redline-cache"] == "hit" and r.json()["object"] == "text_completion"
    assert backend.calls == 1


def test_unknown_model_is_404_not_a_lookup(app_client: Any) -> None:
    client, _ = app_client
    r = client.post("/v1/chat/completions", json={"model": "nope", "messages": [
        {"role": "user", "content": "hi"}], "temperature": 0})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def _greedy(text: str, rid: str) -> GenerationRequest:
    return GenerationRequest(model="m", id=rid, sampling=SamplingParams(temperature=0, max_tokens=4),
                             messages=(Message("user", text),))


async def test_eviction_keeps_max_entries(tmp_path: Path) -> None:
    from redline.cache import CachedAnswer

    store = MemoryStore()
    cache = ResponseCache(CacheConfig(max_entries=3, semantic=False), store)
    await cache.start()
    for i in range(5):
        await cache.put(_greedy(f"q{i}", f"r{i}"), CachedAnswer("m", f"a{i}", "stop", 1, 1, None, 0))
    results = [(await cache.lookup(_greedy(f"q{i}", f"x{i}"))).result for i in range(5)]
    assert results == ["miss", "miss", "hit", "hit", "hit"]
    await cache.close()


async def test_store_failure_fails_open() -> None:
    from redline.store.base import StoreUnavailable

    class Broken(MemoryStore):
        async def get(self, key: str) -> bytes | None:
            raise StoreUnavailable("down")

    cache = ResponseCache(CacheConfig(semantic=False), Broken())
    await cache.start()
    assert (await cache.lookup(_greedy("q", "r"))).result == "miss"
    await cache.close()


async def test_index_sees_entries_written_by_another_replica() -> None:
    store = MemoryStore()
    cfg = CacheConfig(similarity_threshold=0.8)
    a = ResponseCache(cfg, store, embedder=HashingEmbedder())
    b = ResponseCache(cfg, store, embedder=HashingEmbedder())
    await a.start()
    await b.start()
    from redline.cache import CachedAnswer

    assert (await b.lookup(_greedy("How do I change my email address?", "b0"))).result == "miss"
    await a.put(_greedy("How do I change my email address?", "a1"),
                CachedAnswer("m", "Settings > Email.", "stop", 5, 4, None, 0))
    hit = await b.lookup(_greedy("how do i change my email address", "b1"))
    assert hit.result == "semantic" and hit.answer is not None and hit.answer.text == "Settings > Email."
    # the shared list was dropped and rebuilt (expiry): b notices and reloads it whole
    await store.delete("rl:cache:p:" + __import__("redline.cache.keys", fromlist=["x"]).cache_keys(
        _greedy("x", "z"), "m").partition)
    await a.put(_greedy("How do I delete my account?", "a2"),
                CachedAnswer("m", "Contact support.", "stop", 5, 2, None, 0))
    hit = await b.lookup(_greedy("how do i delete my account", "b2"))
    assert hit.result == "semantic" and hit.answer is not None and hit.answer.text == "Contact support."
    await a.close()
    await b.close()
