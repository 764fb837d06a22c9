"""The stream journal: every SSE event of a stream, as the exact bytes sent, kept
in the store so that a client can resume on any replica that shares it.

    stream:<id>:events   list, event seq N at index N-1 (seq counts from 1)
    stream:<id>:meta     present while the stream can be resumed; gone = 404.
                         "live <owner>" while generating, "done <n events>" after
    stream:<id>:reader   set (short TTL) while a client follows from another replica,
                         so that the producing replica keeps generating

A store failure never breaks a live stream: the journal fails open (resume then
works only on the producing replica, from its live buffer).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from redline.store.base import Store, StoreUnavailable

log = logging.getLogger(__name__)

DONE_EVENT_TAIL = b"data: [DONE]\n\n"


def is_done(event: bytes) -> bool:
    return event.endswith(DONE_EVENT_TAIL)


class Journal:
    def __init__(self, store: Store, ttl_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s

    @staticmethod
    def _events(stream_id: str) -> str:
        return f"stream:{stream_id}:events"

    @staticmethod
    def _meta(stream_id: str) -> str:
        return f"stream:{stream_id}:meta"

    @staticmethod
    def _reader(stream_id: str) -> str:
        return f"stream:{stream_id}:reader"

    async def open(self, stream_id: str, owner: str) -> bool:
        return await self._safe(self.store.set(self._meta(stream_id), f"live {owner}".encode(),
                                               self.ttl_s))

    async def append(self, stream_id: str, event: bytes) -> bool:
        return await self._safe(self.store.append(self._events(stream_id), event, self.ttl_s))

    async def finish(self, stream_id: str, n_events: int) -> bool:
        # also refreshes the meta TTL, so that it lives as long as the events it announces
        return await self._safe(self.store.set(self._meta(stream_id), f"done {n_events}".encode(),
                                               self.ttl_s))

    async def drop(self, stream_id: str) -> None:
        """An aborted stream cannot be resumed: forget it (resumes get 404)."""
        await self._safe(self.store.delete(self._meta(stream_id)))
        await self._safe(self.store.delete(self._events(stream_id)))

    async def exists(self, stream_id: str) -> bool:
        return await self.store.get(self._meta(stream_id)) is not None

    async def state(self, stream_id: str) -> tuple[bool, int | None]:
        """(known, events in all when finished else None)."""
        meta = await self.store.get(self._meta(stream_id))
        if meta is None:
            return False, None
        kind, _, rest = meta.decode(errors="replace").partition(" ")
        return True, int(rest) if kind == "done" and rest.isdigit() else None

    async def read(self, stream_id: str, after: int) -> list[bytes]:
        """Events with seq > `after`."""
        return await self.store.range(self._events(stream_id), after)

    async def mark_reader(self, stream_id: str, ttl_s: float) -> None:
        await self._safe(self.store.set(self._reader(stream_id), b"1", ttl_s))

    async def has_reader(self, stream_id: str) -> bool:
        try:
            return await self.store.get(self._reader(stream_id)) is not None
        except StoreUnavailable:
            return False

    async def _safe(self, op: Awaitable[object]) -> bool:
        try:
            await op
        except StoreUnavailable as exc:
            log.warning("stream journal: %s", exc.message)
            return False
        return True
