"""Usage per tenant, key and model, by the hour, kept in the store (GET /v1/admin/usage).

Counted in one place, where every completion ends (a pipeline observer: live requests,
streams whose client left, jobs and batch lines alike): one request, its input, output
and cached tokens, and one error where it failed (status 5xx; a client that left is not
an error). Counts gather in memory and are written every `usage_flush_s`, one counter
add each (atomic in SQLite and Redis, so replicas add to the same counts), so a restart
keeps them; a crash loses at most that last interval. Layout, per hour `h` (Unix hours):

    usage:<h>:index                          hash: "tenant\\tkey\\tmodel" -> b""
    usage:<h>:<tenant>\\t<key>\\t<model>:<n>   counter, n one of NAMES
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from redline.store.base import Store, StoreUnavailable
from redline.types import Finished

log = logging.getLogger(__name__)

NAMES = ("requests", "input_tokens", "output_tokens", "cached_tokens", "errors")
HOUR = 3600


@dataclass(frozen=True, order=True)
class Row:
    tenant: str
    key: str
    model: str


def counts_of(done: Finished) -> tuple[int, ...]:
    u = done.usage
    failed = done.status.startswith("5")
    return (1, u.prompt_tokens if u is not None else 0,
            u.completion_tokens if u is not None else done.output_tokens,
            (u.cached_tokens or 0) if u is not None else 0, int(failed))


class UsageLog:
    """A pipeline observer (`on_finish`) and the admin report's reader (`report`)."""

    def __init__(self, store: Callable[[], Store], flush_s: float, retention_s: float) -> None:
        self.store, self.flush_s, self.retention_s = store, flush_s, retention_s
        self.pending: dict[tuple[int, Row], list[int]] = defaultdict(lambda: [0] * len(NAMES))
        self.keys: dict[str, str] = {}  # request id -> key label (the gate notes it)
        self.writer: asyncio.Task[None] | None = None
        self.lock = asyncio.Lock()

    def note_key(self, request_id: str, key: str) -> None:
        """The key a live request came with (its entry knows it; the pipeline does not)."""
        if len(self.keys) > 100_000:  # requests that never finished: forget the oldest
            for rid in list(self.keys)[:50_000]:
                del self.keys[rid]
        self.keys[request_id] = key

    def on_finish(self, done: Finished) -> None:
        req = done.request
        self._add(Row(req.tenant, self.keys.pop(req.id, "-"), done.model), counts_of(done))

    def failed(self, request_id: str, tenant: str, model: str, status: int) -> None:
        """A request admitted to generate that ended without a completion (it failed
        before its first token: no `on_finish` comes): one request, and an error unless
        the client left. Nothing when its completion was counted already, or when it was
        answered without one of its own (a 202: the job is counted as it runs)."""
        key = self.keys.pop(request_id, None)
        if key is not None and status >= 400:
            self._add(Row(tenant, key, model), (1, 0, 0, 0, int(status >= 500)))

    def _add(self, row: Row, add: tuple[int, ...]) -> None:
        counts = self.pending[(int(time.time()) // HOUR, row)]
        for i, n in enumerate(add):
            counts[i] += n
        if self.writer is None or self.writer.done():
            self.writer = asyncio.get_running_loop().create_task(self._write_soon())

    async def _write_soon(self) -> None:
        await asyncio.sleep(self.flush_s)
        # shielded: a close() that cancels this mid-write must not lose what it took
        await asyncio.shield(self.flush())

    async def flush(self) -> None:
        """Write what was counted since the last flush (kept for the next one if the store
        is down)."""
        async with self.lock:
            taken, self.pending = self.pending, defaultdict(lambda: [0] * len(NAMES))
            store = self.store()
            for (hour, row), counts in taken.items():
                name = f"{row.tenant}\t{row.key}\t{row.model}"
                try:
                    await store.hset(f"usage:{hour}:index", name, b"", ttl=self.retention_s)
                    for i, metric in enumerate(NAMES):
                        if counts[i]:
                            await store.incr(f"usage:{hour}:{name}:{metric}", counts[i],
                                             ttl=self.retention_s)
                            counts[i] = 0  # written: not kept for the next flush
                except StoreUnavailable as exc:
                    log.warning("usage not written (%s); kept for the next flush", exc)
                    kept = self.pending[(hour, row)]
                    for i, n in enumerate(counts):
                        kept[i] += n

    async def report(self, start: float, end: float,
                     tenant: str | None = None) -> dict[Row, dict[str, int]]:
        """Counts per (tenant, key, model) over the hours that overlap [start, end)."""
        await self.flush()  # this replica's latest counts too
        store = self.store()
        out: dict[Row, dict[str, int]] = {}
        for hour in range(int(start) // HOUR, (max(int(end), int(start) + 1) - 1) // HOUR + 1):
            for name in await store.hgetall(f"usage:{hour}:index"):
                t, key, model = name.split("\t", 2)
                if tenant is not None and t != tenant:
                    continue
                row = out.setdefault(Row(t, key, model), dict.fromkeys(NAMES, 0))
                for metric in NAMES:
                    raw = await store.get(f"usage:{hour}:{name}:{metric}")
                    row[metric] += int(raw) if raw else 0
        return out

    async def close(self) -> None:
        await self.flush()  # waits for a write under way, then writes the rest
        if self.writer is not None:
            self.writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.writer


__all__ = ["NAMES", "Row", "UsageLog", "counts_of"]
