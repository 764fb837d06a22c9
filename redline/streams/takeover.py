"""What lets another gateway replica continue a stream whose gateway died (with
`streams.journal_live`; api/stream_takeover.py does the continuing):

    stream:<id>:request     the request as the client sent it (JSON), with what encodes
                            its events (kind, the completion id, the model that answered)
    streams:alive:<owner>   set with a short TTL by each gateway while it produces
                            streams: gone, its streams have no producer any more
    stream:<id>:takeover    a counter: the one gateway that takes it to 1 continues it

With the journal written as the stream goes (every `journal_flush_s`), a resume through
another gateway finds the events up to the last group write before the death; it
continues the answer after their text on an engine replica, as a continuation
(backends/continuation.py), and numbers its events on from the journal's last. What the
dead gateway sent its client after that last write (at most one flush interval of
tokens) is generated again: the same text for a deterministic answer (greedy, or a
seed), possibly other text for a sampled one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from redline.store.base import Store, StoreUnavailable

# a gateway refreshes its mark every ALIVE_TTL_S / 3 while it produces; a resume of a
# stream whose producer died waits up to this long to be sure (api/stream_takeover.py)
ALIVE_TTL_S = 1.5


@dataclass(frozen=True)
class Handed:
    """A stream's request, kept for whoever continues it."""

    kind: str  # "chat" | "text"
    body: dict[str, Any]  # the client's JSON body
    tenant: str
    gen_id: str  # the completion id its chunks carry
    model: str  # the model that answered
    tier: str | None
    session: str | None = None


class Handover:
    def __init__(self, store: Store, ttl_s: float) -> None:
        self.store, self.ttl_s = store, ttl_s

    async def keep(self, stream_id: str, handed: Handed) -> bool:
        try:
            await self.store.set(f"stream:{stream_id}:request", json.dumps(asdict(handed)).encode(),
                                 self.ttl_s)
        except StoreUnavailable:
            return False  # fails open: the stream goes on, only a takeover is not possible
        return True

    async def handed(self, stream_id: str) -> Handed | None:
        raw = await self.store.get(f"stream:{stream_id}:request")
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            return Handed(str(data["kind"]), dict(data["body"]), str(data["tenant"]),
                          str(data["gen_id"]), str(data["model"]), data.get("tier"),
                          data.get("session"))
        except (ValueError, KeyError, TypeError):
            return None

    async def beat(self, owner: str) -> None:
        try:
            await self.store.set(f"streams:alive:{owner}", b"1", ALIVE_TTL_S)
        except StoreUnavailable:
            pass

    async def alive(self, owner: str) -> bool:
        """Unknown (the store is down) counts as alive: nobody takes over blindly."""
        try:
            return await self.store.get(f"streams:alive:{owner}") is not None
        except StoreUnavailable:
            return True

    async def claim(self, stream_id: str) -> bool:
        """True for exactly one caller per stream."""
        try:
            return await self.store.incr(f"stream:{stream_id}:takeover", 1, self.ttl_s) == 1
        except StoreUnavailable:
            return False


def answered(events: list[bytes]) -> tuple[str, int, bool] | None:
    """(the answer's text so far, its content events, whether it ended) from a stream's
    journalled SSE events; None when it streamed what a continuation cannot resend
    (tool calls, reasoning, several choices) or failed."""
    text: list[str] = []
    tokens = 0
    ended = False
    for event in events:
        for line in event.split(b"\n"):
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                ended = True
                continue
            payload = json.loads(data)
            if "error" in payload:
                return None
            for choice in payload.get("choices") or ():
                if choice.get("index"):
                    return None
                if choice.get("finish_reason"):
                    ended = True
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    if delta.get("tool_calls") or delta.get("reasoning_content"):
                        return None
                    piece = delta.get("content")
                else:
                    piece = choice.get("text")
                if piece:
                    text.append(piece)
                    tokens += 1
    return "".join(text), tokens, ended
