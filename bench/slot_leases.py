"""What the concurrency cap costs per request when it is counted in Redis (issue 21):
the lease taken at admission (one script call) and given back at the end (one ZREM),
against a real redis-server on this machine, next to the in-memory count of one replica.

    .venv/bin/python bench/slot_leases.py [--n 5000] [--owners 16]

Each request is one acquire (cap 4, owners in turn, so most are taken and some refused
at the cap) then one release; the renewals run in the background as the server's do.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from jobs_support import redis_server  # noqa: E402

from redline.api.slots import GenerationSlots  # noqa: E402
from redline.store.leases import RedisLeases  # noqa: E402


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] * 1e6


def line(name: str, xs: list[float]) -> str:
    return (f"{name:<34} n={len(xs):<6} p50={pct(xs, 50):8.1f} us  p99={pct(xs, 99):8.1f} us  "
            f"mean={statistics.mean(xs) * 1e6:8.1f} us")


async def run(slots: GenerationSlots, n: int, owners: int) -> tuple[list[float], list[float]]:
    acquire, release = [], []
    held: list[str] = []
    for i in range(n):
        rid = f"r{i}"
        t0 = time.perf_counter()
        if await slots.acquire(f"key:{i % owners}", rid, cap=4):
            held.append(rid)
        acquire.append(time.perf_counter() - t0)
        if len(held) > owners * 2:  # keep about two in flight per owner
            t0 = time.perf_counter()
            slots.release(held.pop(0))
            await asyncio.gather(*slots.pending)  # the ZREM itself, not only its scheduling
            release.append(time.perf_counter() - t0)
    await slots.close()
    return acquire, release


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--owners", type=int, default=16)
    args = ap.parse_args()
    local = asyncio.run(run(GenerationSlots(3600), args.n, args.owners))
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as url:
        shared = asyncio.run(run(GenerationSlots(3600, RedisLeases(url, ttl_s=15)),
                                 args.n, args.owners))
    print(line("memory: acquire", local[0]))
    print(line("memory: release", local[1]))
    print(line("redis lease: acquire", shared[0]))
    print(line("redis lease: release", shared[1]))


if __name__ == "__main__":
    main()
