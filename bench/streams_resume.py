"""Resume overhead: how long from reconnecting to the next token?

Each trial streams a chat completion, reads a random number of events, drops the
connection, then opens a NEW connection and resumes (GET /v1/streams/{id} with
Last-Event-ID). Measured: from the start of the reconnect (TCP connect included) to
the first event received. Baselines, same run: a GET /healthz on a new connection
under the same load (what any request costs), and the gap between two tokens of
uninterrupted streams (what "the next token" costs without a break).

    python bench/streams_resume.py [--url http://127.0.0.1:8000] [--trials 80]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from streams_server import SMOL, server  # noqa: E402

PROMPTS = ["Describe a walk along the sea at dawn.", "Explain how a bicycle works.",
           "Write a short story about a lighthouse keeper.", "What makes bread rise?",
           "Tell me about the history of the printing press.", "Why is the sky blue?"]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def _body(rng: random.Random, max_tokens: int) -> dict:
    return {"model": SMOL, "temperature": 0, "max_tokens": max_tokens, "stream": True,
            "cache": False, "messages": [{"role": "user", "content": rng.choice(PROMPTS)}]}


async def uninterrupted(url: str, body: dict) -> list[float]:
    gaps, last = [], None
    async with httpx.AsyncClient(timeout=60) as c, c.stream(
            "POST", f"{url}/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith('data: {"id"') and '"content":"' in line:
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now
    return gaps


async def interrupted(url: str, body: dict, cut_after: int) -> dict:
    async with httpx.AsyncClient(timeout=60) as c, c.stream(
            "POST", f"{url}/v1/chat/completions", json=body) as r:
        sid, seen, buf = r.headers["x-redline-stream-id"], 0, b""
        async for raw in r.aiter_raw():
            buf += raw
            seen = buf.count(b"\n\n")
            if seen >= cut_after or buf.endswith(b"data: [DONE]\n\n"):
                break
        seq = int(re.findall(rb"^id: [^:]+:(\d+)$", buf, re.M)[min(seen, cut_after) - 1])
    # the connection is gone; reconnect on a new one. The clients are built before the
    # clock starts (building one costs ~40 ms here: not part of reconnecting)
    probe, c = httpx.AsyncClient(timeout=60), httpx.AsyncClient(timeout=60)
    async with probe:  # baseline: any request's round trip on a new connection, same load
        t0 = time.perf_counter()
        await probe.get(f"{url}/healthz")
        healthz = time.perf_counter() - t0
    async with c:
        t0 = time.perf_counter()
        async with c.stream("GET", f"{url}/v1/streams/{sid}",
                            headers={"Last-Event-ID": f"{sid}:{seq}"}) as r:
            headers, first, n = time.perf_counter() - t0, None, 0
            async for raw in r.aiter_raw():
                if first is None:
                    first = time.perf_counter() - t0
                n += raw.count(b"\n\n")
    return {"reconnect_to_next_event_s": first, "reconnect_to_headers_s": headers,
            "healthz_new_connection_s": healthz, "events_after": n, "status": r.status_code}


async def main_async(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    async with httpx.AsyncClient() as c:
        before = (await c.get(f"{args.url}/metrics")).text
    gaps: list[float] = []
    for _ in range(args.baseline):
        gaps += await uninterrupted(args.url, _body(rng, args.max_tokens))
    sem = asyncio.Semaphore(args.concurrency)

    async def trial() -> dict:
        async with sem:
            return await interrupted(args.url, _body(rng, args.max_tokens),
                                     rng.randrange(2, args.max_tokens // 2))
    results = await asyncio.gather(*(trial() for _ in range(args.trials)))
    waits = [r["reconnect_to_next_event_s"] for r in results if r["reconnect_to_next_event_s"]]
    heads = [r["reconnect_to_headers_s"] for r in results]
    probes = [r["healthz_new_connection_s"] for r in results]
    async with httpx.AsyncClient() as c:
        after = (await c.get(f"{args.url}/metrics")).text

    def counter(text: str, name: str) -> float:
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0
    return {
        "trials": len(results), "resumed_ok": sum(r["status"] == 200 for r in results),
        "concurrency": args.concurrency,
        "reconnect_to_next_event_ms": {"p50": 1000 * statistics.median(waits),
                                       "p99": 1000 * _pct(waits, 99), "max": 1000 * max(waits)},
        "reconnect_to_headers_ms": {"p50": 1000 * statistics.median(heads),
                                    "p99": 1000 * _pct(heads, 99)},
        "baseline_healthz_new_connection_ms": {"p50": 1000 * statistics.median(probes),
                                               "p99": 1000 * _pct(probes, 99)},
        "baseline_inter_token_ms": {"p50": 1000 * statistics.median(gaps),
                                    "p99": 1000 * _pct(gaps, 99)},
        "resumes_counted": counter(after, "redline_stream_resumes_total")
        - counter(before, "redline_stream_resumes_total"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url")
    p.add_argument("--trials", type=int, default=80)
    p.add_argument("--baseline", type=int, default=6, help="uninterrupted streams for the baseline")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    with server(args.url, streams={"resume_grace_s": 30}) as url:
        args.url = url
        print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
