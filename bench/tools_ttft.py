"""Added TTFT of a tool-call stream vs a plain text stream through one redline gateway in
front of the fake upstream (TTFT 0, 20 ± 10 ms a step, 32 steps), paired: each of `-c`
clients cycles through three request kinds, so all see the same moments of the machine's
noise: `plain`, `plain2` (the same body: the A/A row, the noise floor) and `tools` (the
same question with two function tools; the upstream answers with two streamed calls).
TTFT: the first chunk with content or a tool-call fragment. The same loop then runs against
the upstream directly: the upstream's own extra work for a tools answer is in both loops,
and redline's added TTFT for tools is the through-redline difference less the direct one.

Usage: .venv/bin/python bench/tools_ttft.py -n 3000 -c 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_common import Procs, session, summary  # noqa: E402

from redline.backends.sse import data_payloads  # noqa: E402
from redline.bench.loadgen import no_gc_pauses  # noqa: E402

ASK = [{"role": "user", "content": "What is the weather in Paris, and the time there?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}}}}]
BODIES = {"plain": {"model": "m", "max_tokens": 32, "messages": ASK},
          "plain2": {"model": "m", "max_tokens": 32, "messages": ASK},
          "tools": {"model": "m", "max_tokens": 32, "messages": ASK, "tools": TOOLS}}


async def first_token(client: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> float | None:
    t0 = time.perf_counter()
    ttft = None
    async with client.post(f"{url}/v1/chat/completions", json={**body, "stream": True}) as r:
        if r.status != 200:
            await r.read()
            return None
        async for payloads in data_payloads(r.content.iter_any()):
            for payload in payloads:
                if ttft is not None or payload == b"[DONE]":
                    continue
                choices = json.loads(payload).get("choices") or []
                delta = choices[0].get("delta", {}) if choices else {}
                if delta.get("content") or delta.get("tool_calls"):
                    ttft = time.perf_counter() - t0
    return ttft


async def run(n: int, concurrency: int) -> dict[str, Any]:
    procs = Procs()
    try:
        up = procs.upstream(ttft=0.0, tpot=0.02, tpot_jitter=0.01)
        url = procs.gateway([{"name": "m", "backend": "openai", "url": up}],
                            routing={"classifier": "off"})
        out: dict[str, Any] = {}
        for via, target in (("redline", url), ("direct", up)):
            out[via] = await loop(target, n, concurrency)
        # the upstream's own extra work for a tools answer is in both: what redline adds
        # is the through-redline difference less the direct one
        out["redline's added TTFT, tools - plain (ms)"] = {
            q: round(out["redline"]["tools - plain (ms)"][q] - out["direct"]["tools - plain (ms)"][q], 3)
            for q in ("p50", "p90", "p99", "mean")}
        return out
    finally:
        procs.stop()


async def loop(url: str, n: int, concurrency: int) -> dict[str, Any]:
    """The paired closed loop against `url` (a gateway, or the upstream itself)."""
    kinds = list(BODIES)
    ttfts: dict[str, list[float]] = {k: [] for k in kinds}
    async with session(concurrency) as client:
        await asyncio.gather(*(first_token(client, url, BODIES[kinds[i % 3]])
                               for i in range(60)))  # warm up
        left = n + 4 * concurrency  # the ramp left out

        async def worker(i: int) -> None:
            nonlocal left
            k = i % 3
            while left > 0:
                left -= 1
                counted = left < n
                t = await first_token(client, url, BODIES[kinds[k]])
                if counted and t is not None:
                    ttfts[kinds[k]].append(t)
                k = (k + 1) % 3

        with no_gc_pauses():
            await asyncio.gather(*(worker(i) for i in range(concurrency)))
    out: dict[str, Any] = {k: summary(xs) for k, xs in ttfts.items()}
    for row, (a, b) in {"A/A plain2 - plain": ("plain", "plain2"),
                        "tools - plain": ("plain", "tools")}.items():
        out[row + " (ms)"] = {q: round((out[b][q] - out[a][q]) * 1000, 3)
                              for q in ("p50", "p90", "p99", "mean")}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=3000, help="requests counted, all kinds together")
    p.add_argument("-c", "--concurrency", type=int, default=16)
    args = p.parse_args()
    print(json.dumps(asyncio.run(run(args.n, args.concurrency)), indent=2))


if __name__ == "__main__":
    main()
