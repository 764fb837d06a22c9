"""The per-tenant cap on concurrent generations across replicas (issue 21): with the
limits in Redis, each generation holds a lease there, so two replicas behind a balancer
share one cap; a lease its holder stops renewing (a crashed replica) ends by itself."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from conftest import LiveApp
from jobs_support import wait_until

from redline.api.app import create_app
from redline.api.auth import digest
from redline.api.slots import GenerationSlots
from redline.backends.fake import FakeBackend
from redline.config import RedlineConfig
from redline.store.leases import RedisLeases

A, B = "sk-team-a", "sk-team-b"


def chat(max_tokens: int = 3, stream: bool = False) -> dict[str, Any]:
    return {"model": "fake", "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]}


def h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def replicas(redis_url: str) -> Iterator[tuple[LiveApp, FakeBackend, LiveApp]]:
    """Two replicas over one Redis, one generation at a time per tenant."""
    cfg = RedlineConfig(auth={"keys": [{"name": "team-a", "sha256": digest(A)},
                                       {"name": "team-b", "sha256": digest(B)}]},
                        limits={"max_concurrent": 1, "concurrent_lease_s": 1.5},
                        streams={"resume_grace_s": 30}, store={"url": redis_url},
                        cache={"enabled": False}, routing={"classifier": "off"})
    first = FakeBackend(tpot_s=0.03)
    with ExitStack() as stack:
        one = stack.enter_context(LiveApp(create_app(cfg, backends={"fake": first})))
        two = stack.enter_context(LiveApp(create_app(cfg, backends={"fake": FakeBackend()})))
        yield one, first, two


def test_the_cap_holds_across_replicas(replicas: tuple[LiveApp, FakeBackend, LiveApp]) -> None:
    one, backend, two = replicas
    # team-a's stream on the first replica; its client leaves, it generates on (~6 s)
    with httpx.Client(base_url=one.url, timeout=30) as c, \
            c.stream("POST", "/v1/chat/completions", json=chat(200, stream=True),
                     headers=h(A)) as r:
        assert r.status_code == 200
        next(r.iter_lines())
    wait_until(lambda: backend.inflight == 1)
    with httpx.Client(base_url=two.url, timeout=30) as c:
        time.sleep(0.6)  # past a renewal (every 0.5 s): the lease is kept, not only taken
        refused = c.post("/v1/chat/completions", json=chat(), headers=h(A))
        assert refused.status_code == 429, refused.text
        err = refused.json()["error"]
        assert err["type"] == "rate_limit_error" and err["code"] == "rate_limit_exceeded"
        assert "concurrent" in err["message"] and float(refused.headers["retry-after"]) > 0
        # a stream too, before it starts
        assert c.post("/v1/chat/completions", json=chat(stream=True),
                      headers=h(A)).status_code == 429
        # another tenant is not affected
        assert c.post("/v1/chat/completions", json=chat(), headers=h(B)).status_code == 200
        assert backend.inflight == 1  # all that while, team-a's stream was generating
        # when it ends, its slot is free on every replica
        wait_until(lambda: backend.inflight == 0, timeout=60)
        wait_until(lambda: c.post("/v1/chat/completions", json=chat(),
                                  headers=h(A)).status_code == 200, timeout=10)


def test_a_lease_whose_holder_crashed_ends_and_a_renewed_one_does_not(redis_url: str) -> None:
    async def run() -> None:
        crashed = RedisLeases(redis_url, ttl_s=0.5)  # takes a lease, then never renews it
        other = RedisLeases(redis_url, ttl_s=0.5)
        assert await crashed.acquire("key:k1", "r1", cap=1)
        assert await crashed.acquire("key:k1", "r1", cap=1)  # held already: still one
        assert not await other.acquire("key:k1", "r2", cap=1)
        assert await other.acquire("key:k2", "r3", cap=1)  # another owner's own count
        await crashed.close()
        deadline = time.monotonic() + 10
        while not await other.acquire("key:k1", "r2", cap=1):  # r1 ends within its ttl
            assert time.monotonic() < deadline, "the crashed holder's lease never ended"
            await asyncio.sleep(0.05)
        assert await other.count("key:k1") == 1
        await other.release("key:k1", "r2")
        await other.release("key:k2", "r3")

        # a live holder renews: its lease outlasts several ttls, then goes when released
        holder = GenerationSlots(3600, RedisLeases(redis_url, ttl_s=0.3))
        assert await holder.acquire("t", "live", cap=1)
        await asyncio.sleep(1.0)  # three ttls
        assert not await other.acquire("t", "late", cap=1)
        holder.release("live")
        await asyncio.gather(*holder.pending)
        assert await other.acquire("t", "late", cap=1)
        await holder.close()
        await other.close()

    asyncio.run(run())


def test_redis_down_fails_open_to_this_replica() -> None:
    async def run() -> None:
        slots = GenerationSlots(3600, RedisLeases("redis://127.0.0.1:1/0", ttl_s=1.0))
        assert await slots.acquire("t", "r1", cap=1)  # counted here instead
        assert not await slots.acquire("t", "r2", cap=1)  # the cap still holds on this replica
        slots.release("r1")
        assert await slots.acquire("t", "r2", cap=1)
        await slots.close()

    asyncio.run(run())
