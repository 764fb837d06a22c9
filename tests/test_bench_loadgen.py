"""The load generator's client: a request sent on a pooled keep-alive connection that the
server drops unanswered is sent again on a fresh connection (llama-server closes idle
keep-alive connections; without the retry its figures counted the client pool's
failures as its own)."""

from __future__ import annotations

import asyncio
import json

from redline.bench.loadgen import Target, _session, one_request

BODY = (b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
        b'data: {"choices":[],"usage":{"completion_tokens":1}}\n\ndata: [DONE]\n\n')


async def serve_once_per_connection() -> tuple[asyncio.Server, list[int]]:
    """Answers the first request on each connection; drops the connection, unanswered,
    at the second (a keep-alive connection closed as the request arrives)."""
    seen: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(0)
        n = 0
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length")), 0)
            json.loads(await reader.readexactly(length))
            n += 1
            if n == 2:
                writer.close()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, seen


async def test_a_dropped_keep_alive_connection_is_retried_on_a_fresh_one() -> None:
    server, connections = await serve_once_per_connection()
    port = server.sockets[0].getsockname()[1]
    target = Target("t", f"http://127.0.0.1:{port}", "m")
    try:
        async with _session(1, 10.0) as client:
            first = await one_request(client, target, {"messages": []})
            second = await one_request(client, target, {"messages": []})
        assert first.ok and first.text == "hi"
        assert second.ok and second.text == "hi", second.error  # retried, not failed
        assert len(connections) == 2  # the retry went out on a new connection
    finally:
        server.close()
        await server.wait_closed()


async def test_a_pool_of_dropped_connections_is_worked_through() -> None:
    """Six clients leave six pooled connections that the server has closed by the next
    request: the request tries each of them, then a fresh one (three tries were not
    enough for llama-server at 16 clients)."""
    server, connections = await serve_once_per_connection()
    port = server.sockets[0].getsockname()[1]
    target = Target("t", f"http://127.0.0.1:{port}", "m")
    try:
        async with _session(6, 10.0) as client:
            firsts = await asyncio.gather(*(one_request(client, target, {"messages": []})
                                            for _ in range(6)))
            assert all(f.ok for f in firsts) and len(connections) == 6
            later = await one_request(client, target, {"messages": []})
        assert later.ok and later.text == "hi", later.error
        assert len(connections) == 7
    finally:
        server.close()
        await server.wait_closed()


async def test_redline_bench_shows_progress_while_it_runs(capsys) -> None:  # type: ignore[no-untyped-def]
    from redline.bench.cli import progress
    from redline.bench.loadgen import Sample

    seen = [Sample(ok=True), Sample(ok=False), Sample(ok=True)]
    ticker = asyncio.create_task(progress("round 1/1 t c=2", seen, 5, tick_s=0.005))
    await asyncio.sleep(0.2)  # well over 10 ticks: a log gets a line every 10
    ticker.cancel()
    err = capsys.readouterr().err
    assert "round 1/1 t c=2: 3/5 done, 1 failed" in err
