"""The relay's fast paths: the per-token SSE chunk is OpenAI's chunk JSON (the JSON an
OpenAI client parses); the server's offer to a response (HOLD_HEAD in the scope's
extensions) must not outlive the response (a reference cycle there is garbage for
the collector on every request)."""
from __future__ import annotations

import asyncio
import gc
import json
import weakref

import pytest

from redline.api.chunks import ChunkEncoder
from redline.api.services import services_of
from redline.api.sse import HOLD_HEAD, OFFERS, EventStream
from redline.types import Chunk

TEXTS = ["Hello", " world", "quote \" and \\ backslash", "line\nbreak\ttab", "naïve — 日本語 🙂",
         "\x00\x1f control", '{"not": "json"}', "}]},", "\x00redline-text\x00"]


@pytest.mark.parametrize("kind", ["chat", "text"])
@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("progress", [None, {"tokens": 3, "expected_tokens": 40, "eta_ms": 812},
                                      {"tokens": 1, "expected_tokens": 64, "eta_ms": None}])
def test_text_chunk_is_the_openai_chunk(kind, include_usage, progress):
    """The per-token event (api/chunks.py) is OpenAI's chunk JSON, whatever the text holds,
    and the same as the general delta encoder's for a plain text chunk."""
    enc = ChunkEncoder(kind, "req-ab\"c", 'model "q" ü', include_usage)
    for text in TEXTS:
        got = enc.text(text, progress)
        assert got == enc.delta(Chunk(text=text, tokens=1), progress)
        data = json.loads(got)
        assert list(data)[:5] == ["id", "object", "created", "model", "choices"]
        assert (data["id"], data["model"]) == ('chatcmpl-ab"c' if kind == "chat" else 'cmpl-ab"c',
                                               'model "q" ü')
        assert ("usage" in data) is include_usage and data.get("usage") is None
        assert data.get("redline") == (None if progress is None else {"progress": progress})
        choice = data["choices"][0]
        assert (choice["delta"]["content"] if kind == "chat" else choice["text"]) == text
        assert choice["logprobs"] is None and choice["finish_reason"] is None


def test_role_chunk_opens_each_choice():
    enc = ChunkEncoder("chat", "req-1", "m")
    data = json.loads(enc.role(2, {"tokens": 0, "expected_tokens": 40, "eta_ms": None}))
    assert data["choices"] == [{"index": 2, "delta": {"role": "assistant", "content": ""},
                                "logprobs": None, "finish_reason": None}]
    assert data["redline"]["progress"]["expected_tokens"] == 40


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


def test_event_stream_without_the_servers_offers_sends_everything_through_send():
    async def events():
        for i in range(3):
            yield f"data: {i}\n\n".encode()

    seen_by_middleware: list[str] = []

    async def app(scope, receive, send):
        async def wrapped(message):  # a middleware that wraps send
            seen_by_middleware.append(message["type"])
            await send(message)
        await EventStream(events(), first_ready=True)(scope, receive, wrapped)

    async def run() -> weakref.ref:
        cycle = _Cycle()
        await app(cycle.scope, cycle.receive, cycle.send)
        assert [m.get("body") for m in cycle.sent[1:]] == [b"data: 0\n\n", b"data: 1\n\n",
                                                           b"data: 2\n\n", b""]
        return weakref.ref(cycle)

    gc.disable()
    try:
        ref = asyncio.run(run())
        assert ref() is None  # freed by reference counting alone
    finally:
        gc.enable()
    assert seen_by_middleware == ["http.response.start"] + ["http.response.body"] * 4


class _Transport(asyncio.Transport):
    """A connection's transport that records each write (each would be one send())."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:  # type: ignore[override]
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default=None):  # type: ignore[no-untyped-def]
        return {"peername": ("127.0.0.1", 5555), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


@pytest.mark.parametrize("first_ready", [True, False])
async def test_response_head_goes_out_with_the_first_event(first_ready):
    """With the first event in hand, the head and that event are one write (one send()
    and one wake-up of the client before its first token); later events are their own
    writes, as they come. Without it, the head goes out alone at once."""
    pytest.importorskip("httptools")
    import uvicorn
    from uvicorn.server import ServerState

    from redline.api.server import protocol
    from redline.config import LimitsConfig

    gate = asyncio.Event()

    async def events():
        yield b"id: s:1\ndata: first\n\n"
        await gate.wait()
        yield b"id: s:2\ndata: second\n\n"

    seen: list[dict] = []

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        seen.append(scope)
        assert HOLD_HEAD in scope["extensions"][OFFERS]  # what EventStream uses
        await EventStream(events(), first_ready=first_ready)(scope, receive, send)

    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    proto = protocol(LimitsConfig())(config=config, server_state=ServerState(), app_state={})
    transport = _Transport()
    proto.connection_made(transport)
    proto.data_received(b"GET /s HTTP/1.1\r\nHost: t\r\n\r\n")
    for _ in range(50):
        await asyncio.sleep(0)
    if first_ready:
        assert len(transport.writes) == 1
        assert transport.writes[0].startswith(b"HTTP/1.1 200")
        assert b"data: first\n\n" in transport.writes[0]
    else:
        assert transport.writes[0].startswith(b"HTTP/1.1 200") and b"first" not in transport.writes[0]
        assert b"data: first\n\n" in transport.writes[1]
    n = len(transport.writes)
    gate.set()
    for _ in range(50):
        await asyncio.sleep(0)
    assert b"data: second\n\n" in transport.writes[n] and transport.writes[-1].endswith(b"0\r\n\r\n")
    # the response is over: the server took its offer back from the scope (it closes
    # over the cycle that holds the scope: a reference cycle left for the collector)
    assert OFFERS not in seen[0].get("extensions", {})
    proto.connection_lost(None)


async def test_completion_routes_answer_json_bodies_as_fastapi_would(tmp_path):
    """A JSON body to a completion route is served by the hot routes (api/hot.py)
    without FastAPI's router, and a body that does not validate gets there exactly the
    error FastAPI's route gives it (here through a `+json` content type, which FastAPI
    reads as JSON and the hot routes leave to it); other content types go to FastAPI."""
    import httpx

    from redline.api.app import create_app
    from redline.api.hot import HotRoutes
    from redline.backends.fake import FakeBackend
    from redline.config import RedlineConfig

    cfg = RedlineConfig(server={"data_dir": str(tmp_path)}, models=[{"name": "fake", "bundled": "fake"}])
    app = create_app(cfg, backends={"fake": FakeBackend(tpot_s=0.0)})

    routed: list[str] = []  # requests that went past HotRoutes, into FastAPI's routing
    app.middleware_stack = app.build_middleware_stack()
    layer = app.middleware_stack
    while not isinstance(layer, HotRoutes):
        layer = layer.app
    inner = layer.app

    async def counted(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http":
            routed.append(scope["path"])
        await inner(scope, receive, send)
    layer.app = counted
    chat = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    via_fastapi = {"content-type": "application/vnd.api+json"}
    async with app.router.lifespan_context(app):
        while not services_of(app).pipeline.ready:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            ok = await c.post("/v1/chat/completions", json=chat)
            streamed = await c.post("/v1/chat/completions", json={**chat, "stream": True})
            text = await c.post("/v1/completions", json={"model": "fake", "prompt": "hi", "max_tokens": 3})
            assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]
            assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
            assert text.status_code == 200 and text.json()["object"] == "text_completion"
            assert routed == []
            bad_bodies = [json.dumps({**chat, "max_tokens": 0}).encode(), b'{"model": "fake", "mess',
                          b"[1, 2]", json.dumps({"model": "fake"}).encode(),
                          json.dumps({**chat, "model": "nope"}).encode()]
            for bad in bad_bodies:
                hot = await c.post("/v1/chat/completions", content=bad,
                                   headers={"content-type": "application/json"})
                assert routed == []
                regular = await c.post("/v1/chat/completions", content=bad, headers=via_fastapi)
                assert routed.pop() == "/v1/chat/completions"
                assert (hot.status_code, hot.json()) == (regular.status_code, regular.json()), bad
            assert hot.status_code == 404 and hot.json()["error"]["code"] == "model_not_found"
            bad = await c.post("/v1/chat/completions", json={**chat, "max_tokens": 0})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
            plain = await c.post("/v1/chat/completions", content=json.dumps(chat).encode(),
                                 headers={"content-type": "text/plain"})
            assert routed == ["/v1/chat/completions"]
            # FastAPI reads a body that is not declared JSON as bytes: not an object
            assert plain.status_code == 400 and plain.json()["error"]["type"] == "invalid_request_error"
            assert (await c.get("/v1/models")).status_code == 200 and routed[-1] == "/v1/models"


def _stream_of(n: int, closed: list[str], gap: float = 0.01):
    async def events():
        try:
            for i in range(n):
                yield f"data: {i}\n\n".encode()
                await asyncio.sleep(gap)
        finally:
            closed.append("closed")
    return events()


def test_client_leaving_ends_the_response_normally_and_closes_the_events():
    """The watcher sees the disconnect and stops the writer task: the events' iterator
    is closed (a stream's reader leaves), and the request ends without an error and
    without a cancellation left on its task."""
    closed: list[str] = []
    sent: list[dict] = []
    left = asyncio.Event()

    async def send(message: dict) -> None:
        sent.append(message)
        if len(sent) == 4:  # the head and three events: then the client goes
            left.set()

    async def receive() -> dict:
        await left.wait()
        return {"type": "http.disconnect"}

    async def run() -> int:
        task = asyncio.current_task()
        await EventStream(_stream_of(100, closed), first_ready=True)(
            {"type": "http", "extensions": {}}, receive, send)
        return task.cancelling()

    assert asyncio.run(run()) == 0
    assert closed == ["closed"]
    assert 4 <= len(sent) < 10 and all(m.get("more_body", True) for m in sent[1:])


def test_cancelling_the_request_cancels_the_writer_and_closes_the_events():
    """Shutting down cancels the request's task: the writer it awaits is cancelled too,
    the events' iterator is closed, and the cancellation propagates."""
    closed: list[str] = []
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def receive() -> dict:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def run() -> None:
        task = asyncio.create_task(EventStream(_stream_of(1000, closed))(
            {"type": "http"}, receive, send))
        while len(sent) < 3:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)
        assert closed == ["closed"]
        assert len([t for t in asyncio.all_tasks() if t is not asyncio.current_task()]) == 0

    asyncio.run(run())


def test_events_after_the_first_go_out_from_one_writer_task():
    """The head and a ready first event leave from the request's own task (no loop trip
    before the first token); the rest from one writer task, so an event does not resume
    the request's whole middleware stack (the CPU per relayed token, docs/BENCHMARKS.md)."""
    senders: list[asyncio.Task | None] = []

    async def send(message: dict) -> None:
        senders.append(asyncio.current_task())

    async def receive() -> dict:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def run() -> asyncio.Task | None:
        await EventStream(_stream_of(5, [], gap=0), first_ready=True)(
            {"type": "http"}, receive, send)
        return asyncio.current_task()

    own = asyncio.run(run())
    assert senders[0] is own and senders[1] is own  # the head, the first event
    writers = set(senders[2:])
    assert len(senders) == 7 and len(writers) == 1 and own not in writers
