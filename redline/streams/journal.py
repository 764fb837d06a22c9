"""The stream journal: every SSE event of a stream, as the exact bytes sent, kept
in the store so that a client can resume on any replica that shares it.

    stream:<id>:events   list of segments: each item is one or more whole events, in
                         order (event seq N is the Nth event; seq counts from 1)
    stream:<id>:meta     a StreamMeta, present while the stream can be resumed (gone: 404)
    stream:<id>:reader   set (short TTL) while a client follows from another replica,
                         so that the producing replica keeps generating
    streams:wanted:<owner>  hash of stream ids that a replica follows through the journal:
                         their owner, which journals a stream read by its own client only
                         at its end, reads it at every group write and journals those as
                         they go (its own client may be gone without its knowing: a
                         half-open connection)

A store failure never breaks a live stream: the journal fails open (resume then
works only on the producing replica, from its live buffer).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable
from dataclasses import asdict, dataclass

from redline.store.base import Store, StoreUnavailable

log = logging.getLogger(__name__)

DONE_EVENT_TAIL = b"data: [DONE]\n\n"


def is_done(event: bytes) -> bool:
    return event.endswith(DONE_EVENT_TAIL)


@dataclass(frozen=True)
class StreamMeta:
    tenant: str  # only this tenant may resume it
    owner: str  # the replica that produces it
    events: int | None = None  # how many in all, once finished

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, raw: bytes) -> StreamMeta | None:
        try:
            data = json.loads(raw)
            return cls(str(data["tenant"]), str(data["owner"]), data.get("events"))
        except (ValueError, KeyError, TypeError):
            return None  # not ours, or from an incompatible version: unknown


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

    async def commit(self, appends: list[tuple[str, list[bytes]]],
                     metas: list[tuple[str, StreamMeta]]) -> bool:
        """Several streams' new events, then their metas, in one write. A meta is set
        when a stream opens and again when it finishes (with its event count), each time
        with the journal TTL, so that it lives as long as the events it announces. Each
        stream's new events go in as one segment (one list item): the store's cost is
        per item, and SSE framing (an event ends at its first blank line) splits them."""
        return await self._safe(self.store.write_many(
            [(self._events(sid), [b"".join(events)], self.ttl_s) for sid, events in appends if events],
            [(self._meta(sid), meta.encode(), self.ttl_s) for sid, meta in metas]))

    async def drop(self, stream_id: str) -> None:
        """An aborted stream cannot be resumed: forget it (resumes get 404)."""
        await self._safe(self.store.delete(self._meta(stream_id)))
        await self._safe(self.store.delete(self._events(stream_id)))

    async def meta(self, stream_id: str) -> StreamMeta | None:
        raw = await self.store.get(self._meta(stream_id))
        return None if raw is None else StreamMeta.decode(raw)

    async def read(self, stream_id: str, after: int) -> list[bytes]:
        """Events with seq > `after`."""
        return (await self.tail(stream_id, 0))[0][max(after, 0):]

    async def tail(self, stream_id: str, segment: int) -> tuple[list[bytes], int]:
        """The events of the segments from index `segment` on, and the index to ask
        for next: a follower reads only what was added since its last read."""
        segments = await self.store.range(self._events(stream_id), segment)
        events = [e + b"\n\n" for s in segments for e in s.split(b"\n\n")[:-1]]
        return events, segment + len(segments)

    @staticmethod
    def _wanted(owner: str) -> str:
        return f"streams:wanted:{owner}"

    async def want(self, owner: str, stream_id: str) -> None:
        """Ask `owner` to journal `stream_id` as it goes (a resume follows it here)."""
        await self._safe(self.store.hset(self._wanted(owner), stream_id, b"1", self.ttl_s))

    async def take_wanted(self, owner: str) -> list[str]:
        """The stream ids asked of `owner` since the last call."""
        key = self._wanted(owner)
        try:
            wanted = list(await self.store.hgetall(key))
        except StoreUnavailable:
            return []
        for stream_id in wanted:
            await self._safe(self.store.hdel(key, stream_id))
        return wanted

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
