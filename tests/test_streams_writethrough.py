"""Writing through: once a stream's only reader has caught up and its connection can take
writes at once, the producer writes each event to the client itself. Whatever happens
(the client reads slowly, a second reader joins, the reader leaves), every event reaches
each client exactly once and in order."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from resilience_server import HardenedServer, fake_config

import redline.api.server as server_mod
from redline.backends.fake import FakeBackend
from redline.streams.live import LiveStream, WriteThrough


class Client:
    """A client connection as the server's write_now sees it: takes writes until told not to."""

    def __init__(self) -> None:
        self.got: list[bytes] = []
        self.refuse = False

    def write_now(self, event: bytes) -> bool:
        if self.refuse:
            return False
        self.got.append(event)
        return True


async def _read(live: LiveStream, client: Client, through: WriteThrough | None,
                offer_after_first: bool = True) -> int:
    """A reader as follow() + EventStream run it: the batches it gets go to the client
    the regular way; it offers write_now after the first batch. Returns the batches."""
    live.join()
    batches = 0
    try:
        async for batch in live.batches(0, through):
            client.got.extend(batch)
            batches += 1
            if through is not None and offer_after_first and through.write_now is None:
                through.offer(client.write_now)
    finally:
        live.leave()
    return batches


def _events(n: int) -> list[bytes]:
    return [f"id: s:{i}\ndata: {i}\n\n".encode() for i in range(1, n + 1)]


async def _started(n: int) -> tuple[LiveStream, Client, list[bytes], asyncio.Task[int]]:
    """A stream of `n` events to come, its first pushed, and one reader that has taken
    it, offered its write_now and sleeps."""
    live, client = LiveStream("s"), Client()
    events = _events(n)
    live.push(events[0])
    reader = asyncio.create_task(_read(live, client, WriteThrough()))
    await asyncio.sleep(0)
    return live, client, events, reader


async def test_the_producer_writes_once_the_reader_has_caught_up() -> None:
    live, client, events, reader = await _started(50)
    for e in events[1:]:
        live.push(e)
        await asyncio.sleep(0)
    live.end()
    batches = await reader
    assert client.got == events
    assert batches == 1  # the 49 others never woke the reader


async def test_a_client_that_cannot_take_a_write_gets_it_the_regular_way() -> None:
    live, client, events, reader = await _started(30)
    for i, e in enumerate(events[1:], 1):
        client.refuse = 10 <= i < 15  # paused for a while, then writable again
        live.push(e)
        await asyncio.sleep(0)
    client.refuse = False
    live.end()
    batches = await reader
    assert client.got == events  # none lost, none twice, in order
    assert 1 < batches < 30  # the refused ones went the regular way, then through again


async def test_refused_events_that_pile_up_arrive_in_one_batch_in_order() -> None:
    live, client, events, reader = await _started(20)
    client.refuse = True
    for e in events[1:]:  # no await between: the reader wakes once, for all of them
        live.push(e)
    client.refuse = False
    live.end()
    await reader
    assert client.got == events


async def test_a_reader_that_leaves_stops_the_writes() -> None:
    live, client, events, reader = await _started(10)
    live.push(events[1])
    reader.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await reader
    for e in events[2:]:
        live.push(e)
    live.end()
    assert client.got == events[:2]
    # a resume reads the rest (and all before) from the buffer
    again = Client()
    await _read(live, again, None)
    assert again.got == events


async def test_with_two_readers_each_gets_every_event_once() -> None:
    live = LiveStream("s")
    first, second = Client(), Client()
    events = _events(40)
    live.push(events[0])
    r1 = asyncio.create_task(_read(live, first, WriteThrough()))
    await asyncio.sleep(0)  # the first writes through
    for e in events[1:10]:
        live.push(e)
        await asyncio.sleep(0)
    r2 = asyncio.create_task(_read(live, second, WriteThrough()))  # a resume joins: not alone
    await asyncio.sleep(0)
    for e in events[10:]:
        live.push(e)
        await asyncio.sleep(0)
    live.end()
    await asyncio.gather(r1, r2)
    assert first.got == events
    assert second.got == events


async def test_an_aborted_stream_hands_back_and_ends_the_reader() -> None:
    live, client, _, reader = await _started(1)
    live.end(aborted=True)
    await asyncio.wait_for(reader, 5)


# ---- on the real server (uvicorn's httptools protocol, loopback TCP) -------------------

@pytest.fixture
def counted_writes(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the server's write_now calls; `calls["sndbuf"]`, when set, shrinks each
    response's socket send buffer first (on loopback the kernel lets it grow to
    megabytes: a stream would never fill it, and the transport never pause)."""
    calls = {"written": 0, "refused": 0, "sndbuf": 0}
    real = server_mod._write_now

    def counting(cycle: Any) -> Any:
        write = real(cycle)
        if calls["sndbuf"]:
            cycle.transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDBUF, calls["sndbuf"])

        def write_now(chunk: bytes) -> bool:
            ok = write(chunk)
            calls["written" if ok else "refused"] += 1
            return ok
        return write_now

    monkeypatch.setattr(server_mod, "_write_now", counting)
    return calls


def _request(max_tokens: int) -> bytes:
    body = json.dumps({"model": "fake", "stream": True, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(body), body))


def _read_response(sock: socket.socket) -> bytes:
    out = b""
    while not out.endswith(b"0\r\n\r\n"):
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


def test_a_stream_over_tcp_is_written_through_and_arrives_whole(tmp_path: Path,
                                                                 counted_writes: dict[str, int]) -> None:
    backend = FakeBackend("fake", tpot_s=0.002)  # tokens come apart: the reader catches up
    with HardenedServer(fake_config(tmp_path), backend) as s:
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=20)
        sock.sendall(_request(40))
        body = _dechunk(_read_response(sock))
        sock.close()
    _check_events(body, 40)
    assert counted_writes["written"] >= 30  # most tokens went straight from the producer


def test_a_slow_reader_over_tcp_gets_every_event_once(tmp_path: Path,
                                                       counted_writes: dict[str, int]) -> None:
    # tokens ~0.5 ms apart: the reader keeps catching up (writing through) while the
    # client does not read, until the server's transport pauses
    backend = FakeBackend("fake", tpot_s=0.0005)
    counted_writes["sndbuf"] = 8192
    with HardenedServer(fake_config(tmp_path), backend) as s:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills fast
        sock.settimeout(20)
        sock.connect(("127.0.0.1", s.port))
        sock.sendall(_request(2000))  # ~600 kB of events: more than the buffers hold
        time.sleep(1.0)  # not reading
        body = _dechunk(_read_response(sock))
        sock.close()
    _check_events(body, 2000)
    assert counted_writes["refused"] >= 1  # the pause was met, and handed back
