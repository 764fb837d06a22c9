"""Gateway CPU per request: the redline process's CPU time (user + system, from
/proc/<pid>/stat) around N streamed requests through it to a fake upstream, at a given
concurrency, for each answer length; the per-token cost is the slope between lengths.
Also prints TTFT through the gateway next to TTFT direct to the upstream, same run.
Usage: .venv/bin/python bench/gateway_cpu.py --tokens 1,65 -c 1 -n 1000   (Linux only)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_common import Procs, closed_loop, summary  # noqa: E402


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(tokens: list[int], concurrency: int, n: int, tpot: float) -> None:
    procs = Procs()
    try:
        up = procs.upstream(ttft=0.0, tpot=tpot)
        gw = procs.gateway([{"name": "m", "backend": "openai", "url": up}], routing={"classifier": "off"})
        pid = procs.procs[-1].pid
        per: dict[int, float] = {}
        for t in [tokens[0], *tokens]:  # the first length twice: the first pass warms up
            body = {"model": "m", "max_tokens": t, "messages": [{"role": "user", "content": "hi"}]}
            await closed_loop(gw, [body] * 200, concurrency)
            direct = summary([r.ttft for r in await closed_loop(up, [body] * n, concurrency)])
            c0 = cpu_s(pid)
            res = await closed_loop(gw, [body] * n, concurrency)
            per[t] = (cpu_s(pid) - c0) / n
            s = summary([r.ttft for r in res if r.ok])
            print(f"{t:4d} tokens, c={concurrency}: gateway CPU {per[t] * 1000:.2f} ms/request; TTFT p50 "
                  f"{s['p50'] * 1000:.2f} ms (direct {direct['p50'] * 1000:.2f}), p99 {s['p99'] * 1000:.2f} "
                  f"(direct {direct['p99'] * 1000:.2f})")
        if len(tokens) > 1:
            lo, hi = min(tokens), max(tokens)
            print(f"per relayed token: {(per[hi] - per[lo]) / (hi - lo) * 1000:.3f} ms of gateway CPU")
    finally:
        procs.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", default="1,65", help="answer lengths, comma-separated")
    p.add_argument("-c", "--concurrency", type=int, default=1)
    p.add_argument("-n", type=int, default=1000)
    p.add_argument("--tpot", type=float, default=0.001, help="upstream seconds per token")
    a = p.parse_args()
    asyncio.run(run([int(x) for x in a.tokens.split(",")], a.concurrency, a.n, a.tpot))


if __name__ == "__main__":
    main()
