"""Routing seen from the API: X-Redline-Tier / X-Redline-Model, 503 + Retry-After when
shedding, and the bundled model as a real local backend behind `auto`."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from redline.api.app import create_app
from redline.backends.fake import FakeBackend
from redline.backends.fake_upstream import Dist, UpstreamSpec, create_upstream
from redline.config import RedlineConfig

ENCODER = ["embeddings", "rerank", "score"]  # what a bundled embedder serves


def client(app: Any) -> TestClient:
    return TestClient(app)


def wait_ready(c: TestClient) -> None:
    for _ in range(1200):  # the semantic cache's embedder loads first
        if c.get("/readyz").status_code == 200:
            return
        time.sleep(0.05)
    raise TimeoutError


def config(**routing: Any) -> RedlineConfig:
    return RedlineConfig(models=[{"name": "small", "bundled": "x", "size_rank": 1},
                                 {"name": "large", "bundled": "x", "size_rank": 2}],
                         routing=routing)


def body(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": text}], "max_tokens": 3,
            "cache": False, **extra}


def test_headers_tell_the_tier_and_model() -> None:
    backends = {"small": FakeBackend("small", size_rank=1), "large": FakeBackend("large", size_rank=2)}
    with client(create_app(config(), backends)) as c:
        wait_ready(c)
        r = c.post("/v1/chat/completions", json=body("what is the capital of France?"))
        assert r.status_code == 200, r.text
        assert r.headers["x-redline-tier"] == "S" and r.headers["x-redline-model"] == "small"
        assert "route;dur=" in r.headers["server-timing"]
        r = c.post("/v1/chat/completions", json=body("write a python function for quicksort with tests"),
                   headers={"X-Redline-Tier": "A"})
        assert r.headers["x-redline-tier"] == "A" and r.headers["x-redline-model"] == "large"
        r = c.post("/v1/chat/completions", json=body("hello", tier="A", model="small"))
        assert r.headers["x-redline-tier"] == "A" and r.headers["x-redline-model"] == "small"
        listed = {m["id"]: m["capabilities"] for m in c.get("/v1/models").json()["data"]}
        assert "auto" in listed
        # each entry says what it serves; an embedder serves no chat
        assert "chat" in listed["small"] and "chat" in listed["auto"]
        for encoder in ("all-minilm-l6-v2", "all-mpnet-base-v2"):
            assert listed.get(encoder, ENCODER) == ENCODER


def test_overload_answers_503_with_retry_after() -> None:
    slow = FakeBackend("small", ttft_s=0.0, tpot_s=0.2, size_rank=1)
    tiers = {"S": {"ttft_s": 1, "total_s": 3, "max_inflight": 1}}
    with client(create_app(config(tiers=tiers), {"small": slow})) as c:
        wait_ready(c)
        with c.stream("POST", "/v1/chat/completions", json=body("hi", stream=True, max_tokens=20)) as s:
            assert s.status_code == 200
            r = c.post("/v1/chat/completions", json=body("hi"))
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "overloaded"


def test_a_shortened_answer_says_so() -> None:
    """A tier-S answer the planner cut to fit the tier's total budget carries
    X-Redline-Degraded: shorten and the max_tokens it was served with; others do not."""
    slow = FakeBackend("small", ttft_s=0.0, tpot_s=0.05, size_rank=1)
    tiers = {"S": {"ttft_s": 1, "total_s": 0.5}}
    with client(create_app(config(tiers=tiers, classifier="off"), {"small": slow})) as c:
        wait_ready(c)
        for _ in range(2):  # what the planner predicts from: seen TTFT and time a token
            assert c.post("/v1/chat/completions",
                          json=body("warm", model="small", max_tokens=6)).status_code == 200
        asked = body("tell me everything", model="small", tier="S", max_tokens=200)
        for stream in (False, True):
            r = c.post("/v1/chat/completions", json={**asked, "stream": stream})
            assert r.status_code == 200, r.text
            assert r.headers["x-redline-degraded"] == "shorten"
            cap = int(r.headers["x-redline-max-tokens"])
            assert 1 < cap < 20, cap
        r = c.post("/v1/chat/completions", json=asked)
        assert r.json()["usage"]["completion_tokens"] == int(r.headers["x-redline-max-tokens"])
        assert r.json()["choices"][0]["finish_reason"] == "length"
        r = c.post("/v1/chat/completions", json={**asked, "tier": "A", "max_tokens": 4})
        assert "x-redline-degraded" not in r.headers and "x-redline-max-tokens" not in r.headers
        # the Responses and Messages APIs say it too
        for path, other in (("/v1/responses", {"model": "small", "input": "tell me everything",
                                               "tier": "S", "max_output_tokens": 200}),
                            ("/v1/messages", {"model": "small", "max_tokens": 200, "tier": "S",
                                              "messages": [{"role": "user", "content": "tell"}]})):
            r = c.post(path, json=other)
            assert r.status_code == 200, r.text
            assert r.headers["x-redline-degraded"] == "shorten", path


def test_openai_backend_through_the_api(live_app: Any) -> None:
    up = live_app(create_upstream(UpstreamSpec(ttft=Dist(0.01), tpot=Dist(0.001))))
    cfg = RedlineConfig(models=[{"name": "remote", "backend": "openai", "url": up.url,
                                 "upstream_model": "served"}])
    with client(create_app(cfg)) as c:
        wait_ready(c)
        r = c.post("/v1/chat/completions", json={**body("hi"), "model": "remote"})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "tok tok tok"
        assert r.json()["usage"]["completion_tokens"] == 3
        assert r.headers["x-redline-model"] == "remote"


@pytest.mark.slow
def test_auto_on_the_real_bundled_model(smol_server: Any) -> None:
    r = httpx.post(f"{smol_server.url}/v1/chat/completions", timeout=60,
                   json=body("what is the capital of France?", max_tokens=8, temperature=0))
    assert r.status_code == 200, r.text
    assert r.headers["x-redline-model"] == "smollm2-135m-instruct"
    assert r.headers["x-redline-tier"] == "S"
    assert r.json()["choices"][0]["message"]["content"]


def test_a_stream_that_falls_back_is_labelled_with_the_model_that_answered() -> None:
    # the stream's chunk template and prediction are made for the first choice while its
    # first token is awaited; when the fallback answers, they must be the fallback's
    broken = FakeBackend("small", ttft_s=0.01, size_rank=1, fail_rate=1.0)
    backends = {"small": broken, "large": FakeBackend("large", ttft_s=0.01, size_rank=2)}
    with client(create_app(config(fallbacks={"small": ["large"]}), backends)) as c:
        wait_ready(c)
        with c.stream("POST", "/v1/chat/completions",
                      json=body("hi", model="small", stream=True, max_tokens=5)) as s:
            assert s.status_code == 200
            assert s.headers["x-redline-model"] == "large"
            chunks = [line[6:] for line in s.iter_lines() if line.startswith("data: {")]
        models = {json.loads(c)["model"] for c in chunks}
        assert models == {"large"} and len(chunks) >= 5
        assert broken.calls >= 1  # the first choice was tried first
