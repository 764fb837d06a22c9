"""The long-tail log: over-budget requests kept with their stage breakdown."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fastapi.testclient import TestClient

from redline.api.app import create_app
from redline.backends.fake import FakeBackend
from redline.config import load_config
from redline.telemetry.longtail import LongTailLog, over_budget
from redline.telemetry.metrics import Metrics
from redline.types import Finished, GenerationRequest, Message, SamplingParams, Usage

S = SimpleNamespace(ttft_s=1.0, total_s=3.0)
A = SimpleNamespace(ttft_s=3.0, total_s=None)
B = SimpleNamespace(ttft_s=None, total_s=None)
BUDGETS = {"S": S, "A": A, "B": B}


def completion(tier: str, ttft: float, total: float, status: str = "200") -> Any:
    req = GenerationRequest("m", SamplingParams(), messages=(Message("user", "hello there"),))
    return Finished(req, "m", tier, "miss", status, "stop", 7, ttft, total, Usage(3, 7), "abc",
                    {"prefill": ttft, "total": total})


def test_over_budget_checks_each_limit() -> None:
    assert over_budget(S, 0.5, 2.0) == []
    assert over_budget(S, 1.5, 2.0) == ["ttft"]
    assert over_budget(S, 1.5, 3.5) == ["ttft", "total"]
    assert over_budget(A, 2.0, 100.0) == []  # A has no whole-answer budget
    assert over_budget(B, 60.0, 600.0) == []
    assert over_budget(None, 60.0, 600.0) == []


def test_ring_is_bounded_and_counts_violations() -> None:
    metrics = Metrics()
    log = LongTailLog(BUDGETS, metrics, capacity=3)
    log.on_finish(completion("S", 0.2, 1.0))  # within budget: not kept
    for i in range(5):
        log.on_finish(completion("S", 1.0 + i, 4.0 + i))
    log.on_finish(completion("A", 4.0, 9.0))
    assert len(log.ring) == 3
    newest = asyncio.run(log.recent(10))
    assert newest[0]["tier"] == "A"
    assert newest[0]["over"] == ["ttft"]
    rec = newest[1]
    assert rec["over"] == ["ttft", "total"]
    assert rec["timings_ms"] == {"prefill": 5000.0, "total": 8000.0}
    assert (rec["prompt_tokens"], rec["completion_tokens"], rec["output_chars"]) == (3, 7, 3)
    assert rec["budget_ms"] == {"ttft": 1000.0, "total": 3000.0}
    assert metrics.value("redline_slo_violations_total", {"tier": "S"}) == 5
    assert metrics.value("redline_slo_violations_total", {"tier": "A"}) == 1


class DictStore:
    """The three Store methods the log uses, in memory (the Store protocol's shape)."""

    def __init__(self) -> None:
        self.counters: dict[str, int] = {}
        self.hashes: dict[str, dict[str, bytes]] = {}

    async def incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        self.counters[key] = self.counters.get(key, 0) + amount
        return self.counters[key]

    async def hset(self, key: str, field: str, value: bytes, ttl: float | None = None) -> None:
        self.hashes.setdefault(key, {})[field] = value

    async def hgetall(self, key: str) -> dict[str, bytes]:
        return dict(self.hashes.get(key, {}))


async def test_store_keeps_a_bounded_shared_ring() -> None:
    store = DictStore()
    log = LongTailLog(BUDGETS, Metrics(), capacity=4, store=lambda: store)  # type: ignore[arg-type,return-value]
    for i in range(10):
        log.on_finish(completion("S", 2.0, 3.0 + i))
    await log.drain()
    assert len(store.hashes["telemetry:slow"]) == 4
    # another replica reading the same store sees the newest four, newest first
    other = LongTailLog(BUDGETS, Metrics(), capacity=4, store=lambda: store)  # type: ignore[arg-type,return-value]
    records = await other.recent(10)
    assert [r["seq"] for r in records] == [10, 9, 8, 7]
    assert records[0]["total_ms"] == 12000.0


def _app(tmp: Path, **telemetry: Any) -> Any:
    tiers = {"S": {"ttft_s": 0.01, "total_s": 0.035}, "A": {"ttft_s": 3.0}, "B": {}}
    cfg = load_config(server={"data_dir": str(tmp)}, routing={"tiers": tiers}, telemetry=telemetry,
                      cache={"enabled": False}, store={"url": "memory://"})
    return create_app(cfg, backends={"fake": FakeBackend(ttft_s=0.03, tpot_s=0.002)})


def _ready(client: TestClient) -> None:
    deadline = time.monotonic() + 60
    while client.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_admin_slow_lists_over_budget_requests_with_stages(tmp_path: Path) -> None:
    with TestClient(_app(tmp_path)) as client:
        _ready(client)
        body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        assert client.post("/v1/chat/completions", json=body | {"tier": "S"}).status_code == 200
        assert client.post("/v1/chat/completions", json=body | {"tier": "A"}).status_code == 200
        slow = client.get("/v1/admin/slow").json()
        assert slow["object"] == "list"
        assert [r["tier"] for r in slow["data"]] == ["S"]  # A's 3 s first-token budget was met
        rec = slow["data"][0]
        assert rec["over"] == ["ttft", "total"]
        assert {"prefill", "decode", "total"} <= set(rec["timings_ms"])
        assert rec["model"] == "fake" and rec["cache"] == "miss" and rec["completion_tokens"] == 5
        metrics = client.get("/metrics").text
        assert 'redline_slo_violations_total{tier="S"} 1.0' in metrics
        assert client.get("/v1/admin/slow?limit=0").status_code == 400


def test_stats_summarises_tiers(tmp_path: Path) -> None:
    with TestClient(_app(tmp_path)) as client:
        _ready(client)
        body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "tier": "S"}
        for _ in range(3):
            client.post("/v1/chat/completions", json=body)
        stats = client.get("/v1/admin/stats?window_s=60").json()
        tier = stats["live"]["tiers"]["S"]
        assert tier["requests"] == 3 and tier["slo_attainment"] == 0.0
        assert tier["ttft_ms"]["p99"] >= 30.0  # the fake backend's first token takes 30 ms
        assert stats["slo_violations_total"]["S"] == 3
        assert 0.0 <= stats["hardware"]["cpu_utilization"] <= 1.0
        assert len(stats["slow"]) == 3
