"""Per-tenant limits: 429 + Retry-After in the OpenAI shape; the official client sees a
RateLimitError, and with retries on it waits Retry-After and gets through."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from redline.api.app import create_app
from redline.api.auth import digest
from redline.backends.fake import FakeBackend
from redline.config import RedlineConfig

KEY_A, KEY_B = "sk-a", "sk-b"
# in memory, no response cache: every request reaches the fake backend
FAKE_ONLY: dict[str, Any] = {"store": {"url": "memory://"}, "cache": {"enabled": False}}
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def config(**limits: Any) -> RedlineConfig:
    keys = [{"name": "a", "sha256": digest(KEY_A)}, {"name": "b", "sha256": digest(KEY_B), "rpm": 5}]
    return RedlineConfig(auth={"keys": keys}, limits=limits, **FAKE_ONLY)


@pytest.fixture
def make_client() -> Iterator[Any]:
    clients: list[TestClient] = []

    def make(cfg: RedlineConfig) -> TestClient:
        c = TestClient(create_app(cfg, backends={"fake": FakeBackend()}))
        c.__enter__()
        clients.append(c)
        deadline = time.monotonic() + 60
        while c.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        return c

    yield make
    for c in clients:
        c.__exit__(None, None, None)


def chat(c: TestClient, key: str) -> httpx.Response:
    return c.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"})


def test_requests_per_window_then_429(make_client: Any) -> None:
    c = make_client(config(rpm=2))
    ok = [chat(c, KEY_A) for _ in range(2)]
    assert [r.status_code for r in ok] == [200, 200]
    assert ok[0].headers["x-ratelimit-limit-requests"] == "2"
    assert ok[1].headers["x-ratelimit-remaining-requests"] == "0"
    r = chat(c, KEY_A)
    assert r.status_code == 429
    err = r.json()["error"]
    assert err["type"] == "rate_limit_error" and err["code"] == "rate_limit_exceeded"
    assert "Limit 2" in err["message"]
    assert 1 <= int(r.headers["retry-after"]) <= 60
    # another key has its own counter (and its own, larger quota)
    assert [chat(c, KEY_B).status_code for _ in range(5)] == [200] * 5
    assert chat(c, KEY_B).status_code == 429


def test_tokens_per_window_counted_from_usage(make_client: Any) -> None:
    c = make_client(config(tpm=12))
    # each request reserves max_tokens 4 + ~1 for its prompt, and uses 1 prompt word + 4
    # tokens = 5 (given back down to that at its end); a third would take the window past
    # 12, so it is refused at admission instead of overrunning it
    assert [chat(c, KEY_A).status_code for _ in range(2)] == [200, 200]
    deadline = time.monotonic() + 5  # usage is settled just after the answer ends
    r = chat(c, KEY_A)
    while r.status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
        r = chat(c, KEY_A)
    assert r.status_code == 429
    assert "tokens" in r.json()["error"]["message"] and "retry-after" in r.headers
    assert chat(c, KEY_B).status_code == 200


def test_no_limits_no_headers(make_client: Any) -> None:
    c = make_client(config())
    r = chat(c, KEY_A)
    assert r.status_code == 200 and "x-ratelimit-limit-requests" not in r.headers


def test_official_client_rate_limit_error_and_retry_after(live_app: Any) -> None:
    server = live_app(create_app(config(rpm=1, window_s=2), backends={"fake": FakeBackend()}))
    seen: list[int] = []
    http = httpx.Client(event_hooks={"response": [lambda r: seen.append(r.status_code)]})
    strict = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY_A, max_retries=0, http_client=http)
    strict.chat.completions.create(**CHAT)
    with pytest.raises(openai.RateLimitError) as info:
        strict.chat.completions.create(**CHAT)
    retry_after = int(info.value.response.headers["retry-after"])
    assert 1 <= retry_after <= 2
    # with retries (the client's default), it sleeps Retry-After and then succeeds: its own
    # backoff (0.5 s and up) alone would hit the 2 s window again, so one 429 then a 200
    # means it waited as told
    seen.clear()
    patient = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY_A, max_retries=3, http_client=http)
    out = patient.chat.completions.create(**CHAT)
    assert out.choices[0].finish_reason == "length"
    assert seen == [429, 200]


@pytest.mark.slow
def test_replicas_share_counters_in_redis(make_client: Any, redis_url: str) -> None:
    cfg = config(rpm=3).model_copy(update={"store": RedlineConfig(store={"url": redis_url}).store})
    a, b = make_client(cfg), make_client(cfg)
    assert [chat(c, KEY_A).status_code for c in (a, b, a)] == [200, 200, 200]
    r = chat(b, KEY_A)  # the fourth, on either replica, is over the shared quota
    assert r.status_code == 429 and "retry-after" in r.headers
