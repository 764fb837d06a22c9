"""The long-tail log: every request over its tier's budget, with its stage breakdown.

An `Observer` of the pipeline (`on_finish(completion)`): cheap for requests within
budget (two comparisons), and for the slow ones it keeps a record in a bounded ring in
memory and, when the app has a store, in a bounded hash in the store so that every
replica's slow requests show up in `GET /v1/admin/slow`.

A record (JSON):
    {"id", "at" (unix s), "model", "tier", "cache", "status", "over": ["ttft", "total"],
     "budget_ms": {"ttft", "total"}, "ttft_ms", "total_ms", "timings_ms": {stage: ms},
     "prompt_tokens", "completion_tokens", "prompt_chars", "output_chars"}
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from redline.telemetry.metrics import Metrics

if TYPE_CHECKING:
    from redline.store.base import Store
    from redline.types import Finished

log = logging.getLogger(__name__)

STORE_KEY = "telemetry:slow"
STORE_SEQ = "telemetry:slow:seq"


class Budget(Protocol):
    """What a tier promises (config.TierBudget); None: no limit."""

    ttft_s: float | None
    total_s: float | None


def over_budget(budget: Budget | None, ttft_s: float | None, total_s: float | None) -> list[str]:
    if budget is None:
        return []
    over = []
    if budget.ttft_s is not None and ttft_s is not None and ttft_s > budget.ttft_s:
        over.append("ttft")
    if budget.total_s is not None and total_s is not None and total_s > budget.total_s:
        over.append("total")
    return over


class LongTailLog:
    def __init__(self, budgets: Mapping[str, Budget], metrics: Metrics, capacity: int = 200,
                 store: Callable[[], Store | None] = lambda: None, ttl_s: float = 7 * 86400) -> None:
        self.budgets = budgets
        self.metrics = metrics
        self.capacity = capacity
        self.ring: deque[dict[str, Any]] = deque(maxlen=capacity)
        self._store = store
        self._ttl_s = ttl_s
        self._writes: set[asyncio.Task[None]] = set()

    def on_finish(self, completion: Finished) -> None:
        total = completion.total_s
        over = over_budget(self.budgets.get(completion.tier), completion.ttft_s, total)
        if not over:
            return
        self.metrics.slo_violations.labels(completion.tier).inc()
        record = _record(completion, over, self.budgets[completion.tier])
        self.ring.append(record)
        log.info("long tail: %s tier %s over %s (%.0f ms)", record["id"], record["tier"],
                 "+".join(over), record["total_ms"] or 0)
        store = self._store()
        if store is not None:
            self._spawn(self._persist(store, record))

    def _spawn(self, coro: Any) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no loop (a sync caller): the ring has it
            coro.close()
            return
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _persist(self, store: Store, record: dict[str, Any]) -> None:
        try:
            # a ring of `capacity` slots in one hash: bounded, shared by every replica
            seq = await store.incr(STORE_SEQ)
            record = record | {"seq": seq}
            await store.hset(STORE_KEY, str(seq % self.capacity), json.dumps(record).encode(),
                             ttl=self._ttl_s)
        except Exception as exc:  # the log must never break serving; the ring still has it
            log.warning("long-tail record not stored: %s", exc)

    async def recent(self, limit: int = 50) -> list[dict[str, Any]]:
        """Newest first: from the store when there is one (every replica), else this one's ring."""
        store = self._store()
        if store is not None:
            try:
                raw = await store.hgetall(STORE_KEY)
                records = [json.loads(v) for v in raw.values()]
                records.sort(key=lambda r: r.get("seq", 0), reverse=True)
                return records[:limit]
            except Exception as exc:
                log.warning("long-tail store unreadable, showing this replica's: %s", exc)
        return list(reversed(self.ring))[:limit]

    async def drain(self) -> None:
        """Wait for pending store writes (shutdown, tests)."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def _record(c: Finished, over: list[str], budget: Budget) -> dict[str, Any]:
    req = c.request
    prompt = req.prompt or "".join(m.content for m in req.messages or ())
    return {
        "id": req.id, "at": round(time.time(), 3), "model": c.model, "tier": c.tier,
        "cache": c.cache, "status": c.status, "over": over,
        "budget_ms": {"ttft": _ms(budget.ttft_s), "total": _ms(budget.total_s)},
        "ttft_ms": _ms(c.ttft_s), "total_ms": _ms(c.total_s),
        "timings_ms": {k: _ms(v) for k, v in c.timings.items()},
        "prompt_tokens": c.usage.prompt_tokens if c.usage else None,
        "completion_tokens": c.usage.completion_tokens if c.usage else c.output_tokens,
        "prompt_chars": len(prompt), "output_chars": len(c.text),
    }
