"""The relay's fast paths: the per-token SSE chunk is built from a template and must be
byte for byte what encoding the chunk's dict gives (the JSON an OpenAI client parses);
the server's own send, put in the scope for body chunks, must not outlive the request
(a reference cycle there is garbage for the collector on every request)."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref

import pytest

from redline.api.openai_routes import _ChatShape, _TextShape
from redline.api.sse import RAW_SEND, EventStream, expose_raw_send

TEXTS = ["Hello", " world", "quote \" and \\ backslash", "line\nbreak\ttab", "naïve — 日本語 🙂",
         "\x00\x1f control", '{"not": "json"}', "}]},", "\x00redline-text\x00"]


@pytest.mark.parametrize("shape_cls", [_ChatShape, _TextShape])
@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("progress", [None, {"tokens": 3, "expected_tokens": 40, "eta_ms": 812},
                                      {"tokens": 1, "expected_tokens": 64, "eta_ms": None}])
def test_template_chunk_equals_the_encoded_dict(shape_cls, include_usage, progress):
    shape = shape_cls("req-ab\"c", 'model "q" ü')
    encode = shape.encoder(include_usage)
    for text in TEXTS:
        redline = None if progress is None else {"progress": progress}
        want = json.dumps(shape.piece(text, None, include_usage, redline=redline),
                          separators=(",", ":"))
        got = encode(text, progress)
        assert got == want
        choice = json.loads(got)["choices"][0]
        assert (choice["delta"]["content"] if shape_cls is _ChatShape else choice["text"]) == text


class _Cycle:
    """Like uvicorn's RequestResponseCycle: it holds the scope, and send is its method."""

    def __init__(self) -> None:
        self.scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
        self.sent: list[dict] = []

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    async def receive(self) -> dict:
        await asyncio.sleep(3600)  # the client stays
        return {"type": "http.disconnect"}


def test_event_stream_sends_body_through_the_raw_send_and_leaves_no_cycle():
    async def events():
        for i in range(3):
            yield f"data: {i}\n\n".encode()

    seen_by_middleware: list[str] = []

    async def app(scope, receive, send):
        async def wrapped(message):  # a middleware that wraps send
            seen_by_middleware.append(message["type"])
            await send(message)
        await EventStream(events())(scope, receive, wrapped)

    async def run() -> weakref.ref:
        cycle = _Cycle()
        await expose_raw_send(app)(cycle.scope, cycle.receive, cycle.send)
        assert [m.get("body") for m in cycle.sent[1:]] == [b"data: 0\n\n", b"data: 1\n\n",
                                                           b"data: 2\n\n", b""]
        assert RAW_SEND not in cycle.scope
        return weakref.ref(cycle)

    gc.disable()
    try:
        ref = asyncio.run(run())
        assert ref() is None  # freed by reference counting alone
    finally:
        gc.enable()
    # the start and the end go through the middlewares; the token chunks do not
    assert seen_by_middleware == ["http.response.start", "http.response.body"]
