"""How a stream's events reach its clients: the producer appends to the LiveStream and
knows nothing of connections; each reader wakes for what came and its response writes
it through the ASGI `send`. Whatever happens (the client reads slowly, a second reader
joins, the reader leaves), every event reaches each client exactly once and in order,
and an event goes out as soon as it is produced (not held until the stream ends)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from resilience_server import HardenedServer, fake_config

from redline.backends.fake import FakeBackend
from redline.streams.live import LiveStream
from redline.types import Chunk, GenerationRequest, Usage


async def _read(live: LiveStream, got: list[bytes]) -> int:
    """A reader as the manager's follow() runs it: each piece it wakes for is one write
    to its client. Returns the pieces."""
    pieces = 0
    async for piece in live.follow(0):
        got.extend(e + b"\n\n" for e in piece.split(b"\n\n")[:-1])  # back into events
        pieces += 1
    return pieces


def _events(n: int) -> list[bytes]:
    return [f"id: s:{i}\ndata: {i}\n\n".encode() for i in range(1, n + 1)]


async def test_a_reader_that_keeps_up_gets_each_event_as_it_comes() -> None:
    live, got = LiveStream("s"), []
    events = _events(30)
    reader = asyncio.create_task(_read(live, got))
    for i, e in enumerate(events):
        live.push(e)
        await asyncio.sleep(0)  # the reader runs: the event is written before the next comes
        assert got == events[:i + 1]
    live.end()
    assert await reader == 30  # one write per event


async def test_events_that_pile_up_arrive_in_one_batch_in_order() -> None:
    live, got = LiveStream("s"), []
    events = _events(20)
    live.push(events[0])
    reader = asyncio.create_task(_read(live, got))
    await asyncio.sleep(0)
    for e in events[1:]:  # no await between: the reader wakes once, for all of them
        live.push(e)
    live.end()
    assert await reader == 2
    assert got == events


async def test_a_reader_that_leaves_reads_no_more_and_a_resume_reads_all() -> None:
    live, got = LiveStream("s"), []
    events = _events(10)
    live.push(events[0])
    reader = asyncio.create_task(_read(live, got))
    await asyncio.sleep(0)
    live.push(events[1])
    await asyncio.sleep(0)
    reader.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert live.readers == 0 and live.left_at is not None
    for e in events[2:]:
        live.push(e)
    live.end()
    assert got == events[:2]
    again: list[bytes] = []
    await _read(live, again)  # a resume reads the rest (and all before) from the buffer
    assert again == events


async def test_with_two_readers_each_gets_every_event_once() -> None:
    live = LiveStream("s")
    first: list[bytes] = []
    second: list[bytes] = []
    events = _events(40)
    live.push(events[0])
    r1 = asyncio.create_task(_read(live, first))
    await asyncio.sleep(0)
    for e in events[1:10]:
        live.push(e)
        await asyncio.sleep(0)
    r2 = asyncio.create_task(_read(live, second))  # a resume joins
    await asyncio.sleep(0)
    for e in events[10:]:
        live.push(e)
        await asyncio.sleep(0)
    live.end()
    await asyncio.gather(r1, r2)
    assert first == events
    assert second == events


async def test_an_aborted_stream_ends_the_reader() -> None:
    live, got = LiveStream("s"), []
    live.push(_events(1)[0])
    reader = asyncio.create_task(_read(live, got))
    await asyncio.sleep(0)
    live.end(aborted=True)
    await asyncio.wait_for(reader, 5)
    assert len(got) == 1


# ---- on the real server (uvicorn's httptools protocol, loopback TCP) -------------------

class GatedBackend(FakeBackend):
    """A token only when the test releases one: what the client has read before a
    release was sent before that token existed."""

    def __init__(self) -> None:
        super().__init__("fake")
        self.gate = threading.Semaphore(0)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        n = request.sampling.max_tokens
        for i in range(n):
            await asyncio.to_thread(self.gate.acquire)
            last = i == n - 1
            yield Chunk(text=f" w{i}", tokens=1, finish_reason="length" if last else None,
                        usage=Usage(1, n) if last else None)


def _request(max_tokens: int) -> bytes:
    body = json.dumps({"model": "fake", "stream": True, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(body), body))


def _read_until(sock: socket.socket, out: bytes, marker: bytes) -> bytes:
    while marker not in out:
        chunk = sock.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


def _dechunk(raw: bytes) -> bytes:
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    body = b""
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return body
        body, rest = body + rest[:size], rest[size + 2:]


def _check_events(body: bytes, tokens: int) -> None:
    events = [e for e in body.split(b"\n\n") if e]
    ids = [int(e.split(b"\n")[0].rpartition(b":")[2]) for e in events]
    assert ids == list(range(1, len(events) + 1))  # none lost, none twice, in order
    assert events[-1].endswith(b"data: [DONE]")
    texts = [json.loads(e.split(b"data: ", 1)[1])["choices"][0]["delta"].get("content")
             for e in events[1:-2]]
    assert len(texts) == tokens and all(texts)


def test_each_token_reaches_the_client_before_the_next_is_made(tmp_path: Path) -> None:
    backend = GatedBackend()
    with HardenedServer(fake_config(tmp_path), backend) as s:
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=20)
        sock.sendall(_request(6))
        raw = b""
        for i in range(6):
            backend.gate.release()  # one token exists: the client must get it now
            raw = _read_until(sock, raw, b'"content":" w%d"' % i)
            assert b'"content":" w%d"' % i in raw  # a held write would time out the recv
            assert b'" w%d"' % (i + 1) not in raw
        raw = _read_until(sock, raw, b"0\r\n\r\n")
        sock.close()
    _check_events(_dechunk(raw), 6)


def test_a_slow_reader_over_tcp_gets_every_event_once(tmp_path: Path) -> None:
    # tokens ~0.5 ms apart while the client does not read: the server's transport
    # pauses (its buffers fill), `send` waits, and the reader catches up in batches
    backend = FakeBackend("fake", tpot_s=0.0005)
    with HardenedServer(fake_config(tmp_path), backend) as s:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills fast
        sock.settimeout(20)
        sock.connect(("127.0.0.1", s.port))
        sock.sendall(_request(2000))  # ~600 kB of events: more than the buffers hold
        time.sleep(1.0)  # not reading
        body = _dechunk(_read_until(sock, b"", b"0\r\n\r\n"))
        sock.close()
    _check_events(body, 2000)
