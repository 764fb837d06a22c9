"""The upstream HTTP/1.1 client against raw TCP servers that answer byte by byte as each
test needs (a head, then a pause; a body delimited by the connection's end; silence)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from redline.backends.http1 import Http1Connection, Http1Pool, UpstreamTimeout
from redline.backends.openai_compat import OpenAICompatBackend
from redline.errors import BackendError
from redline.types import GenerationRequest, Message, SamplingParams

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse(text: str, finish: str | None = None) -> bytes:
    fin = "null" if finish is None else f'"{finish}"'
    return (f'data: {{"choices":[{{"index":0,"delta":{{"content":"{text}"}},'
            f'"finish_reason":{fin}}}]}}\n\n').encode()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    return head + await reader.readexactly(length)


async def serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def chat() -> GenerationRequest:
    return GenerationRequest(model="m", sampling=SamplingParams(max_tokens=5),
                             messages=(Message("user", "hi"),))


async def test_the_head_alone_wakes_no_one_and_the_request_goes_out_at_once() -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(HEAD)
        await writer.drain()
        await asyncio.sleep(0.3)
        writer.write(chunk(b"first bytes"))
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    server, url = await serve(handler)
    pool = Http1Pool(url + "/v1", connect_timeout_s=2, read_timeout_s=5)
    conn = await pool.acquire()
    conn.send(pool.request_head("/chat/completions", 2) + b"{}")
    await conn.wait()
    # woken by the body, not by the head that came 0.3 s before it
    assert conn.status == 200 and conn.take() == [b"first bytes"] and not conn.complete
    assert seen[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert seen[0].endswith(b"\r\n\r\n{}")
    assert await conn.read_all() == b"" and conn.complete
    pool.release(conn)
    assert pool.idle == 1
    pool.close()
    server.close()


async def test_a_silent_upstream_times_out_and_its_connection_is_closed() -> None:
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(HEAD + chunk(sse("a")))
        await writer.drain()
        await reader.read()  # silent until the client goes
        closed.set()

    server, url = await serve(handler)
    b = OpenAICompatBackend("m", url, ttft_timeout_s=0.3, read_timeout_s=0.3)
    chunks = [c async for c in b.stream(chat())]
    assert [c.text for c in chunks] == ["a", ""] and chunks[-1].finish_reason == "error"
    assert "UpstreamTimeout" in (chunks[-1].error or "")
    await asyncio.wait_for(closed.wait(), 2)
    assert b.pool.idle == 0 and b.load() == 0
    server.close()

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()  # never answers; returns when the client goes

    server, url2 = await serve(mute)
    pool = Http1Pool(url2, connect_timeout_s=1, read_timeout_s=0.2)
    conn = await pool.acquire()
    conn.send(pool.request_head("/x", 0))
    with pytest.raises(UpstreamTimeout):
        await conn.wait()
    server.close()


@pytest.mark.parametrize("framing", ["chunked", "content-length", "connection-close"])
async def test_every_body_framing_streams_to_the_end(framing: str) -> None:
    body = sse("one") + sse("two", "stop") + b"data: [DONE]\n\n"

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if framing == "chunked":
            writer.write(HEAD + chunk(body[:30]) + chunk(body[30:]) + b"0\r\n\r\n")
        elif framing == "content-length":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body)
            await writer.drain()
            writer.close()
            return
        await writer.drain()
        await reader.read()

    server, url = await serve(handler)
    b = OpenAICompatBackend("m", url)
    chunks = [c async for c in b.stream(chat())]
    assert "".join(c.text for c in chunks) == "onetwo" and chunks[-1].finish_reason == "stop"
    # kept for the next request unless the upstream said it closes
    assert b.pool.idle == (0 if framing == "connection-close" else 1)
    await b.close()
    server.close()


async def test_a_pooled_connection_the_upstream_closed_is_not_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        body = sse("x", "stop") + b"data: [DONE]\n\n"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        writer.close()  # keep-alive said, then closed anyway (an idle timeout upstream)

    server, url = await serve(handler)
    b = OpenAICompatBackend("m", url)
    for _ in range(3):
        assert "".join([c.text async for c in b.stream(chat())]) == "x"
        await asyncio.sleep(0.05)  # the close reaches the client
    assert b.pool.opened == 3
    # back to back: the close may not have arrived when the next request goes out on the
    # kept connection; that request is sent again on a new one
    for _ in range(5):
        assert "".join([c.text async for c in b.stream(chat())]) == "x"
    await b.close()
    server.close()


@pytest.mark.parametrize("whole", [False, True])
async def test_a_body_cut_short_of_its_length(whole: bool) -> None:
    """Cut before [DONE]: an error, not an end. Cut after it: the answer was whole."""
    body = sse("one") + sse("two", "stop") + b"data: [DONE]\n\n" if whole else sse("one") + sse("two")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
                     % (len(body) + 100) + body)  # promised 100 bytes more than it sends
        await writer.drain()
        writer.close()

    server, url = await serve(handler)
    b = OpenAICompatBackend("m", url)
    chunks = [c async for c in b.stream(chat())]
    assert chunks[0].text == "one"
    assert chunks[-1].finish_reason == ("stop" if whole else "error")
    assert b.pool.idle == 0
    server.close()


async def test_closed_mid_stream_after_tokens_ends_with_an_error_chunk() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(HEAD + chunk(sse("a")) + chunk(sse("b")))
        await writer.drain()
        writer.close()

    server, url = await serve(handler)
    b = OpenAICompatBackend("m", url)
    chunks = [c async for c in b.stream(chat())]
    assert [c.text for c in chunks[:2]] == ["a", "b"] and chunks[-1].finish_reason == "error"
    with pytest.raises(BackendError, match="unreachable"):
        async for _ in OpenAICompatBackend("m", "http://127.0.0.1:9", connect_timeout_s=0.5).stream(chat()):
            pass
    server.close()


class _Sink(asyncio.Transport):
    def write(self, data: bytes) -> None:  # type: ignore[override]
        pass

    def is_closing(self) -> bool:
        return False


@pytest.mark.parametrize("relaying", [False, True])
async def test_a_relayed_streams_wake_up_goes_behind_callbacks_that_came_with_it(relaying: bool) -> None:
    """Past a stream's first token, its chunks wake their reader one loop pass later:
    another request's first step, scheduled in the same pass, goes first (its first token
    waits on it; a relayed token between two others does not notice)."""

    loop = asyncio.get_running_loop()
    conn = Http1Connection(loop, read_timeout_s=5)
    conn.connection_made(_Sink())
    conn.send(b"POST / HTTP/1.1\r\n\r\n")
    conn.data_received(HEAD)
    order: list[str] = []

    async def reader() -> None:
        await conn.wait()
        order.append("relayed chunk")

    task = asyncio.create_task(reader())
    await asyncio.sleep(0)  # the reader waits
    conn.relaying = relaying
    conn.data_received(chunk(sse("x")))
    loop.call_soon(order.append, "another request's step")  # came in the same pass
    await task
    await asyncio.sleep(0)
    if relaying:
        assert order == ["another request's step", "relayed chunk"]
    else:
        assert order == ["relayed chunk", "another request's step"]


async def test_the_backend_relays_after_the_first_token_only() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(HEAD + chunk(b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'))
        await writer.drain()
        for text in ("a", "b"):
            await asyncio.sleep(0.05)
            writer.write(chunk(sse(text)))
            await writer.drain()
        writer.write(chunk(sse("", "stop")) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()

    server, url = await serve(handler)
    backend = OpenAICompatBackend("m", url)
    conns: list[Http1Connection] = []
    acquire = backend.pool.acquire

    async def spy(fresh: bool = False):  # type: ignore[no-untyped-def]
        conn = await acquire(fresh)
        conns.append(conn)
        return conn

    backend.pool.acquire = spy  # type: ignore[method-assign]
    relaying = []
    async for c in backend.stream(chat()):
        relaying.append((c.text, conns[0].relaying))
    await backend.close()
    server.close()
    # the wait for the first token (after the role chunk) was at once; the next ones relayed
    assert relaying[0] == ("a", False) and relaying[1] == ("b", True)
