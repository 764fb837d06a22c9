"""Paired A/B of two redline trees as gateways: one fake upstream (TTFT 0, 20 ± 10 ms/token,
32 tokens), gateway A from one source tree and gateway B from another (each started
with `python -m redline.cli serve` in its tree, so a `git worktree` of an older commit
serves as A), and one closed loop of `-c` clients in which each client alternates its
requests between A and B. Both gateways see the same moments of the machine's noise, so
their TTFT difference is far steadier than two separate runs' (an A/A run of this
script moved p50 by 0.02 ms, where separate runs of routing_overhead.py move it by
0.1-0.3 ms). Each gateway carries about half the streams.

Usage: git worktree add /tmp/redline-old <commit>
       .venv/bin/python bench/gateway_ab.py --a /tmp/redline-old --b . -n 6000
       (--a-env / --b-env: JSON of extra environment variables for that gateway)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_common import Procs, session, stream_once, summary  # noqa: E402

from redline.bench.loadgen import no_gc_pauses  # noqa: E402


async def run(a: Path, b: Path, n: int, concurrency: int, a_env: dict[str, str],
              b_env: dict[str, str]) -> dict[str, Any]:
    procs = Procs()
    try:
        up = procs.upstream(ttft=0.0, tpot=0.02, tpot_jitter=0.01)
        models = [{"name": "m", "backend": "openai", "url": up}]
        urls = {side: procs.gateway(models, cwd=tree, env=env, routing={"classifier": "off"})
                for side, tree, env in (("A", a, a_env), ("B", b, b_env))}
        body = {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}
        ttfts: dict[str, list[float]] = {"A": [], "B": []}
        async with session(concurrency) as client:
            for url in urls.values():  # warm both up
                await asyncio.gather(*(stream_once(client, url, body) for _ in range(100)))
            left = n + 4 * concurrency  # the loop's first 4 x concurrency: the ramp, left out

            async def worker(i: int) -> None:
                nonlocal left
                side = "AB"[i % 2]
                while left > 0:
                    left -= 1
                    counted = left < n
                    r = await stream_once(client, urls[side], body)
                    if counted and r.ok:
                        ttfts[side].append(r.ttft)
                    side = "B" if side == "A" else "A"

            with no_gc_pauses():
                await asyncio.gather(*(worker(i) for i in range(concurrency)))
        out: dict[str, Any] = {side: summary(xs) for side, xs in ttfts.items()}
        out["b_minus_a_ms"] = {q: (out["B"][q] - out["A"][q]) * 1000 for q in ("p50", "p90", "p99", "mean")}
        return out
    finally:
        procs.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--a", type=Path, required=True, help="source tree of gateway A")
    p.add_argument("--b", type=Path, required=True, help="source tree of gateway B")
    p.add_argument("-n", type=int, default=6000)
    p.add_argument("-c", "--concurrency", type=int, default=64)
    p.add_argument("--a-env", default="{}")
    p.add_argument("--b-env", default="{}")
    args = p.parse_args()
    out = asyncio.run(run(args.a.resolve(), args.b.resolve(), args.n, args.concurrency,
                          json.loads(args.a_env), json.loads(args.b_env)))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
