"""Server-sent events: `id: <stream_id>:<seq>` on every event, seq from 1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

DONE = "[DONE]"
# What the HTTP server (api/server.py) offers a response: an ASGI extension, a dict in
# `scope["extensions"][OFFERS]`; absent under any other server (EventStream then just
# uses `send`). Every body chunk goes through `send`; the offer only changes how the
# head leaves.
OFFERS = "redline.response"
# HOLD_HEAD: a callable that makes the connection hold its next write (the response head)
# and send it with the one after (the first body chunk); it returns a release() that
# sends whatever is still held
HOLD_HEAD = "hold_head"


# one encoder for all events: json.dumps with any non-default argument builds a new one per call
compact_json = json.JSONEncoder(separators=(",", ":")).encode


def event(stream_id: str, seq: int, data: dict[str, Any] | str) -> bytes:
    body = data if isinstance(data, str) else compact_json(data)
    return f"id: {stream_id}:{seq}\ndata: {body}\n\n".encode()


def parse_event_id(value: str) -> tuple[str, int]:
    """`strm-…:12` → ("strm-…", 12). Raises ValueError on anything else."""
    stream_id, _, seq = value.rpartition(":")
    if not stream_id or not seq.isdigit():
        raise ValueError(f"not an event id: {value!r}")
    return stream_id, int(seq)


class EventStream(Response):
    """`text/event-stream` from an async iterator of encoded events.

    Starlette's StreamingResponse runs each response in an anyio task group (a task, a
    cancel scope, a task repr on cancel): a tenth of a relayed request's CPU here. This
    sends from the request's own task, and one watcher task waits for the client's
    disconnect and cancels the send loop, which closes the iterator (a stream's reader
    leaves; see streams/manager.py)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], headers: Mapping[str, str] | None = None,
                 status_code: int = 200, first_ready: bool = False) -> None:
        """`first_ready`: the first chunk is already there (the iterator yields it
        without waiting), so the response head goes out with it in one write: one
        send() and one wake-up of the client fewer before its first token. Each chunk
        the iterator yields is one `send` (the server writes it at once: a stream's
        events are flushed as they come)."""
        self.body_iterator = content
        self.status_code = status_code
        self.first_ready = first_ready
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        state = {"streaming": True, "gone": False}

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            # only while this task waits inside the loop below (one thread: it is
            # suspended at one of the loop's awaits whenever this runs)
            if state["streaming"]:
                state["gone"] = True
                task.cancel()

        loop = asyncio.get_running_loop()
        # with the first chunk in hand, the watcher starts after it is written (the
        # first token's path is short); else now, for a client that leaves before it
        watcher = None if self.first_ready else loop.create_task(watch())
        finished = False
        offers = (scope.get("extensions") or {}).get(OFFERS) or {}
        hold = offers.get(HOLD_HEAD) if self.first_ready else None
        release = hold() if hold is not None else None
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            first = True
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if first:
                    first = False
                    if release is not None:  # sent with the head; later chunks go as they come
                        release()
                        release = None
                    if watcher is None:
                        watcher = loop.create_task(watch())
            finished = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not state["gone"]:
                raise
            task.uncancel()  # the client left: a normal end for this request
        finally:
            if release is not None:
                release()
            state["streaming"] = False
            if watcher is not None:
                watcher.cancel()
        if not finished:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()
