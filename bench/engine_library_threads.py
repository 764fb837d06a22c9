"""torch and BLAS next to the embedded engine, A/B in one run (issue 2's engine figures
depend on it).

Two redline servers on the bundled SmolLM2 with the default config (semantic cache on:
all-MiniLM-L6-v2 and the semantic index run in the same process as llama.cpp), one with
`server.library_threads` unset (it resolves to 1 there: torch and OpenBLAS on one thread)
and one with `0` (their defaults: every core, the behaviour before). Each server's cache
first gets 2000 answers (an index search is then a matrix-vector product big enough for
OpenBLAS to use its threads: below ~1000 rows it does not). Then each is driven in turn at
concurrency 8, 64 output tokens each (`ignore_eos`, `"cache": false`), alternating the
order every round, while a side client asks a cached question, paraphrased, every 100 ms
(a semantic hit: an embedding and an index search, no generation). Prints total output
tok/s, how busy the server's two busiest threads (llama.cpp's) were, the machine's idle
time, and the side lookups' latency and hit count.

    .venv/bin/python bench/engine_library_threads.py [--rounds 3] [--requests 24] [--cached 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_bench import MODEL, body_maker, start_redline  # noqa: E402  (bench/ is on the path)

from redline.bench.loadgen import Target, run_closed  # noqa: E402
from redline.bench.report import summarize  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


VERBS = ("fix", "clean", "paint", "sell", "insure", "move", "store", "rent", "repair", "ship")
THINGS = ("bicycle", "piano", "sofa", "laptop", "boat", "guitar", "fridge", "camera", "tent",
          "lamp", "mirror", "carpet", "scooter", "printer", "kayak", "drone", "oven", "desk",
          "violin", "tractor")
PLACES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Denver", "Madrid", "Seoul", "Nairobi",
          "Perth")


def questions(n: int) -> list[str]:
    """Up to 2000 distinct questions, each a semantic hit only for its own paraphrase."""
    return [f"How do I {v} a {t} in {p}?" for p in PLACES for t in THINGS for v in VERBS][:n]


def start(tmp: Path, threads: int | None) -> tuple[subprocess.Popen[bytes], str]:
    # the shipped Q4_1 file (the figure in docs/BENCHMARKS.md was measured on it)
    return start_redline(tmp, weights="as-shipped",
                         server=None if threads is None else {"library_threads": threads})


def ask_body(question: str, max_tokens: int = 4) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0}


async def fill(url: str, qs: list[str]) -> None:
    async with aiohttp.ClientSession() as s:
        todo = iter(qs)

        async def worker() -> None:
            for q in todo:
                async with s.post(f"{url}/v1/chat/completions", json=ask_body(q, 1)) as r:
                    await r.read()

        await asyncio.gather(*(worker() for _ in range(8)))
        await asyncio.sleep(2.0)  # answers are stored after the response


async def lookups(url: str, qs: list[str], every: float, stop: asyncio.Event,
                  out: list[tuple[float, str]]) -> None:
    async with aiohttp.ClientSession() as s:
        i = 0
        while not stop.is_set():
            q = qs[(i * 37) % len(qs)].lower().rstrip(".?")  # a paraphrase: semantic
            i += 1
            t0 = time.perf_counter()
            async with s.post(f"{url}/v1/chat/completions", json=ask_body(q, 1)) as r:
                await r.read()
                out.append((time.perf_counter() - t0, r.headers.get("x-redline-cache", "")))
            await asyncio.sleep(every)


def thread_ticks(pid: int) -> dict[str, int]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[tid] = int(fields[11]) + int(fields[12])  # utime + stime
    return out


def idle_ticks() -> int:
    return int(Path("/proc/stat").read_text().split("\n", 1)[0].split()[4])


async def measured(url: str, n: int, qs: list[str], every: float) -> tuple[float, list[tuple[float, str]]]:
    stop = asyncio.Event()
    asked: list[tuple[float, str]] = []
    task = asyncio.create_task(lookups(url, qs, every, stop, asked)) if qs else None
    extra = {"cache": False, "ignore_eos": True}
    run = await run_closed(Target("x", url, MODEL, extra=extra), body_maker(64), 8, n)
    stop.set()
    if task is not None:
        await task
    return summarize(run).tok_s, asked


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=24, help="per server and round")
    ap.add_argument("--cached", type=int, default=2000,
                    help="answers in each cache before the runs (0: no side lookups either)")
    ap.add_argument("--every", type=float, default=0.1, help="seconds between side lookups")
    args = ap.parse_args()
    qs = questions(args.cached)
    tmp = Path(tempfile.mkdtemp(prefix="redline-threads-"))
    labels = {"unset": None, "0": 0}
    servers = {}
    rows: dict[str, list[tuple[float, float, float]]] = {k: [] for k in labels}
    side: dict[str, list[tuple[float, str]]] = {k: [] for k in labels}
    try:
        for name, threads in labels.items():
            servers[name] = start(tmp, threads)
        for _, url in servers.values():
            t0 = time.perf_counter()
            asyncio.run(fill(url, qs))
            print(f"cache filled with {len(qs)} answers in {time.perf_counter() - t0:.0f} s", flush=True)
            asyncio.run(measured(url, 8, [], 0))  # warm
        for r in range(args.rounds):
            for name in labels if r % 2 == 0 else list(labels)[::-1]:
                proc, url = servers[name]
                before, idle0, t0 = thread_ticks(proc.pid), idle_ticks(), time.perf_counter()
                tok_s, asked = asyncio.run(measured(url, args.requests, qs, args.every))
                wall = time.perf_counter() - t0
                after, idle1 = thread_ticks(proc.pid), idle_ticks()
                busy = sorted((after[t] - before.get(t, 0)) / TICKS / wall for t in after)[-2:]
                idle = (idle1 - idle0) / TICKS / wall
                rows[name].append((tok_s, statistics.mean(busy), idle))
                side[name] += asked
                print(f"round {r}  library_threads={name:5s}  {tok_s:6.1f} tok/s  llama.cpp threads "
                      f"{busy[0]:.0%} / {busy[1]:.0%} busy  machine idle {idle:.0%} of a core  "
                      f"side lookups {len(asked)}", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()
    print()
    for name, got in rows.items():
        tok = statistics.mean(x[0] for x in got)
        busy_mean = statistics.mean(x[1] for x in got)
        idle_mean = statistics.mean(x[2] for x in got)
        line = (f"library_threads={name:5s}: {tok:6.1f} tok/s ({' / '.join(f'{x[0]:.1f}' for x in got)}), "
                f"llama.cpp threads {busy_mean:.0%} busy, machine idle {idle_mean:.0%} of a core")
        if side[name]:
            lat = sorted(x[0] for x in side[name])
            hits = sum(1 for x in side[name] if x[1] == "semantic")
            line += (f"; side lookups {len(lat)}, {hits} semantic hits, "
                     f"p50 {lat[len(lat) // 2] * 1000:.0f} ms")
        print(line)
    a, b = (statistics.mean(x[0] for x in rows[k]) for k in labels)
    print(f"tok/s ratio, unset (1 thread) / 0 (every core): {a / b:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
