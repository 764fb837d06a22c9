"""Rate limits without holes: a burst of concurrent requests cannot overrun a small token
budget (max_tokens reserved at admission, the rest given back at the end), and an open
server keeps its budgets per client address, so rotating bearer tokens buys nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import LiveApp

from redline.api.app import create_app
from redline.api.auth import digest
from redline.api.limits import TenantLimiter
from redline.backends.fake import FakeBackend
from redline.config import LimitsConfig, RedlineConfig

BASE: dict[str, Any] = {"store": {"url": "memory://"}, "cache": {"enabled": False},
                        "routing": {"classifier": "off"}}


def chat(max_tokens: int) -> dict[str, Any]:
    return {"model": "fake", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def slow_keyed() -> Iterator[LiveApp]:
    cfg = RedlineConfig(auth={"keys": [{"name": "small", "sha256": digest("sk-small"),
                                        "tpm": 100}]}, **BASE)
    app = create_app(cfg, backends={"fake": FakeBackend(tpot_s=0.02)})
    with LiveApp(app) as live:
        yield live


async def burst(url: str, n: int, headers: list[dict[str, str]], max_tokens: int) -> list[Any]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        return list(await asyncio.gather(*(
            c.post("/v1/chat/completions", json=chat(max_tokens), headers=headers[i % len(headers)])
            for i in range(n))))


def test_a_parallel_burst_cannot_overrun_a_small_token_budget(slow_keyed: LiveApp) -> None:
    """tpm 100, twenty requests of max_tokens 20 at once: before reservations every one
    was admitted (the window was empty when each arrived) and 20 x 20+ tokens ran."""
    replies = asyncio.run(burst(slow_keyed.url, 20, [{"Authorization": "Bearer sk-small"}], 20))
    ok = [r for r in replies if r.status_code == 200]
    refused = [r for r in replies if r.status_code == 429]
    assert len(ok) + len(refused) == 20, [r.text for r in replies]
    used = sum(r.json()["usage"]["total_tokens"] for r in ok)
    assert 1 <= len(ok) <= 4 and used <= 100, (len(ok), used)
    err = refused[0].json()["error"]
    assert err["type"] == "rate_limit_error" and refused[0].headers["retry-after"]


def test_unused_tokens_are_given_back() -> None:
    async def run() -> None:
        limiter = TenantLimiter(LimitsConfig(tpm=50), [])
        assert (await limiter.reserve("t", "req-1", 40)).allowed
        assert not (await limiter.reserve("t", "req-2", 20)).allowed  # 40 + 20 > 50
        assert (await limiter.reserve("t", "req-3", 10)).allowed  # the refusal took nothing
        r = limiter.reserved.pop("req-1")
        await limiter.settle(r, used=5)  # 35 come back
        assert (await limiter.reserve("t", "req-4", 30)).allowed  # 5 + 10 + 30 <= 50
        assert not (await limiter.reserve("t", "req-5", 10)).allowed
        # an overshoot is charged on top
        await limiter.settle(limiter.reserved.pop("req-3"), used=14)
        stats = await limiter.local.tokens.get_window_stats(limiter._item(50), "tok", "t")
        assert stats.remaining == 50 - (5 + 14 + 30)

    asyncio.run(run())


def test_an_open_server_limits_per_address_not_per_token() -> None:
    """No keys: each bearer token is a tenant of its own for the cache, but admission and
    charging both count against the client's address."""
    cfg = RedlineConfig(limits={"tpm": 60, "rpm": 1000}, **BASE)
    app = create_app(cfg, backends={"fake": FakeBackend()})
    with LiveApp(app) as live, httpx.Client(base_url=live.url, timeout=30) as c:
        codes = []
        for i in range(6):  # ~22 tokens each (20 + prompt): the third does not fit
            r = c.post("/v1/chat/completions", json=chat(20),
                       headers={"Authorization": f"Bearer rotating-{i}"})
            codes.append(r.status_code)
        assert codes[:2] == [200, 200] and set(codes[2:]) == {429}, codes


def test_batch_lines_count_against_their_tenants_limits(tmp_path: Any) -> None:
    """tpm 30, a batch of four lines of ~12 tokens: two fit the window, the other two wait
    for it (they do not fail), and the tenant's live request is refused meanwhile: the
    batch's tokens are its tokens."""
    import io
    import json

    from jobs_support import wait_until

    cfg = RedlineConfig(auth={"keys": [{"name": "t", "sha256": digest("sk-t"), "tpm": 30}]},
                        server={"data_dir": str(tmp_path)}, **BASE)
    app = create_app(cfg, backends={"fake": FakeBackend()})
    h = {"Authorization": "Bearer sk-t"}
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": chat(10)} for i in range(4)]
    with LiveApp(app) as live, httpx.Client(base_url=live.url, timeout=30, headers=h) as c:
        raw = "".join(json.dumps(x) + "\n" for x in lines).encode()
        f = c.post("/v1/files", data={"purpose": "batch"},
                   files={"file": ("in.jsonl", io.BytesIO(raw), "application/jsonl")}).json()
        b = c.post("/v1/batches", json={"input_file_id": f["id"],
                                        "endpoint": "/v1/chat/completions"}).json()

        def counts() -> dict[str, int]:
            return c.get(f"/v1/batches/{b['id']}").json()["request_counts"]  # type: ignore[no-any-return]

        wait_until(lambda: counts()["completed"] == 2, timeout=30)
        r = c.post("/v1/chat/completions", json=chat(10))  # 11 more: 33 > 30
        assert r.status_code == 429 and "tokens" in r.json()["error"]["message"]
        batch = c.get(f"/v1/batches/{b['id']}").json()
        assert batch["status"] == "in_progress" and counts() == {"total": 4, "completed": 2,
                                                                   "failed": 0}
