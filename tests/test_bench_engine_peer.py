"""bench/engine_peer.py's first token apart for a closed loop's first wave (a burst at an
idle server) and its later requests (sent as answers end), from the request numbers the
load generator's closed loop gives its samples."""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import engine_peer as peer  # noqa: E402

from redline.bench.loadgen import RunResult, Sample, Target, run_closed  # noqa: E402

BODY = (b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
        b'data: {"choices":[],"usage":{"completion_tokens":1}}\n\ndata: [DONE]\n\n')


async def test_a_closed_loop_numbers_its_requests_in_the_order_they_were_sent() -> None:
    sent: list[int] = []  # the `n` of each body, as the server received them

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            body = await reader.readexactly(length)
            sent.append(int(body.split(b'"n": ')[1].split(b"}")[0]))
            await asyncio.sleep(0.01 * len(sent) % 0.03)  # answers end out of order
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        run = await run_closed(Target("t", f"http://127.0.0.1:{port}", "m"),
                               lambda i: {"messages": [], "n": i}, 3, 9)
    finally:
        server.close()
        await server.wait_closed()
    assert sorted(s.index for s in run.samples) == list(range(9))
    assert sorted(sent[:3]) == [0, 1, 2]  # the first wave went out first
    assert all(s.ok for s in run.samples)


def run_of(ttfts: list[float], concurrency: int) -> RunResult:
    return RunResult("t", concurrency, None, 1.0,
                     [Sample(ok=True, ttft=t, index=i) for i, t in enumerate(ttfts)])


def test_the_first_token_is_read_for_the_first_wave_and_the_later_requests_apart() -> None:
    # four clients: a burst of four slow first tokens, then four fast ones
    run = run_of([0.10, 0.12, 0.14, 0.16, 0.02, 0.03, 0.04, 0.05], 4)
    assert peer.ttft_p50(run, "first") > 0.10
    assert peer.ttft_p50(run, "later") < 0.05
    assert peer.ttft_p50(run, "first") > peer.ttft_p50(run) > peer.ttft_p50(run, "later")
    other = run_of([0.05] * 8, 4)
    assert peer.ttft_ratio([run], [other], "first") > 2
    assert peer.ttft_ratio([run], [other], "later") < 1
    assert math.isnan(peer.ttft_p50(run_of([0.1, 0.2], 2), "later"))  # one wave only
