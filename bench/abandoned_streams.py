"""Issue 21's figure: with 16 abandoned long streams (clients gone, generation going on for a
resume), a fresh request's TTFT stays within 2x its TTFT on an idle server.

One `redline serve` with the bundled SmolLM2 (8 slots), the response cache off per request:
1. idle: `--probes` fresh requests one after the other, TTFT each;
2. 16 streams of `--long` tokens (ignore_eos) opened, each read to its first token and then
   dropped (the connection closed): the server keeps generating them for a resume, and
   under contention they yield their slots (preempt-and-continue);
3. the same fresh requests again while those generate; then the ratio of the medians.

    .venv/bin/python bench/abandoned_streams.py [--abandoned 16] [--probes 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_common import Procs  # noqa: E402

from redline.bench.loadgen import Target, one_request  # noqa: E402

SMOL = "smollm2-135m-instruct"


async def probe(url: str, n: int, salt: str) -> tuple[list[float], list[float]]:
    """`n` fresh requests, one after the other: TTFT and TPOT of each (seconds)."""
    target = Target("redline", url, SMOL, extra={"cache": False})
    out, tpots = [], []
    async with aiohttp.ClientSession() as client:
        for i in range(n):
            body = {"messages": [{"role": "user", "content": f"({salt} {i}) Name a color."}],
                    "max_tokens": 8, "temperature": 0}
            s = await one_request(client, target, body)
            if not s.ok:
                raise SystemExit(f"probe failed: {s.error}")
            out.append(s.ttft)
            if s.tpot is not None:
                tpots.append(s.tpot)
    return out, tpots


async def abandon(url: str, n: int, tokens: int) -> None:
    """Open `n` long streams, read each to its first data line, then drop it."""
    async def one(i: int) -> None:
        async with aiohttp.ClientSession() as client:
            body = {"model": SMOL, "stream": True, "cache": False, "temperature": 0,
                    "ignore_eos": True, "max_tokens": tokens,
                    "messages": [{"role": "user", "content": f"({i}) Tell a long story."}]}
            resp = await client.post(f"{url}/v1/chat/completions", json=body)
            await resp.content.readline()  # the stream began
            resp.close()  # the client leaves; the server goes on for a resume

    await asyncio.gather(*(one(i) for i in range(n)))


async def main_async(a: argparse.Namespace) -> dict[str, object]:
    procs = Procs()
    try:
        url = procs.gateway([{"name": SMOL, "bundled": SMOL, "n_seq_max": 8, "n_ctx": 2048}])
        await probe(url, 2, "warm")
        idle, idle_tpot = await probe(url, a.probes, "idle")
        await abandon(url, a.abandoned, a.long)
        await asyncio.sleep(0.5)
        busy, busy_tpot = await probe(url, a.probes, "busy")
        ratio = statistics.median(busy) / statistics.median(idle)
        return {"abandoned": a.abandoned, "long_tokens": a.long,
                "idle_ttft_ms": [round(x * 1000, 1) for x in idle],
                "with_abandoned_ttft_ms": [round(x * 1000, 1) for x in busy],
                "median_ratio": round(ratio, 2), "goal": "<= 2.0",
                # what the streams nobody reads cost a live answer's later tokens
                "tpot_ms_idle_vs_with_abandoned": [
                    round(statistics.median(idle_tpot) * 1000, 1) if idle_tpot else None,
                    round(statistics.median(busy_tpot) * 1000, 1) if busy_tpot else None]}
    finally:
        procs.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--abandoned", type=int, default=16)
    p.add_argument("--long", type=int, default=512, help="tokens each abandoned stream asks for")
    p.add_argument("--probes", type=int, default=8)
    print(json.dumps(asyncio.run(main_async(p.parse_args())), indent=2))


if __name__ == "__main__":
    main()
