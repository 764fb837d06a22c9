"""Server-sent events: `id: <stream_id>:<seq>` on every event, seq from 1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from redline.closing import aclose

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
    sends the head and a ready first chunk from the request's own task, and the rest
    from one writer task. The writer's stack is this loop and the iterator: an event
    wakes it alone, where in the request's task it would resume every middleware of
    the stack on the way down and up (a dozen frames, each event). One watcher task
    waits for the client's disconnect and cancels the writer, which closes the
    iterator (a stream's reader leaves; see streams/manager.py)."""

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
        body = self.body_iterator
        offers = (scope.get("extensions") or {}).get(OFFERS) or {}
        hold = offers.get(HOLD_HEAD) if self.first_ready else None
        release = hold() if hold is not None else None
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            if self.first_ready:  # there without waiting: out with the head, in one write
                async for chunk in body:
                    await send({"type": "http.response.body", "body": chunk,
                                "more_body": True})
                    break
        except BaseException:
            await aclose(body)
            raise
        finally:
            if release is not None:  # later chunks go as they come
                release()
        loop = asyncio.get_running_loop()
        writer = loop.create_task(_write(body, send))
        watcher = loop.create_task(_watch(receive, writer))
        try:
            await writer  # this task cancelled (shutting down): so is the writer it awaits
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if (task is not None and task.cancelling()) or not watcher.done():
                raise
            # the watcher cancelled the writer: the client left, a normal end
        finally:
            watcher.cancel()


async def _write(body: AsyncIterator[bytes], send: Send) -> None:
    """The writer task: the rest of the events, then the body's end. Cancelled (the
    client left, or shutting down), it closes the iterator."""
    try:
        async for chunk in body:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except BaseException:
        await aclose(body)
        raise
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _watch(receive: Receive, writer: asyncio.Task[None]) -> None:
    """Waits for the client's disconnect, then cancels the writer."""
    while (await receive())["type"] != "http.disconnect":
        pass
    writer.cancel()
