"""Paired A/B of two redline trees as gateways: one fake upstream (TTFT 0, 20 ± 10 ms/token,
32 tokens), gateway A from one source tree and gateway B from another (each started
with `python -m redline.cli serve` in its tree, so a `git worktree` of an older commit
serves as A), and one closed loop of `-c` clients in which each client alternates its
requests between A and B. Both gateways see the same moments of the machine's noise, so
their TTFT difference is far steadier than two separate runs' (an A/A run of this
script moved p50 by 0.02 ms, where separate runs of routing_overhead.py move it by
0.1-0.3 ms). Each gateway carries about half the streams.

It prints, for A (the baseline) and B side by side: TTFT p50/p90/p99 and B − A; each
gateway's CPU time per relayed token (its process's user + system time over the loop,
/proc, Linux only) and B/A; the route stage's own time (the gateway's Server-Timing
`route`); and the TTFT each adds over the upstream (a direct closed loop at half the
concurrency after the paired one: each gateway carried about half the streams). Next
to them, issue 24's limits: B − A p50 ≤ +0.15 ms, p99 ≤ +1 ms, CPU/token ≤ +10 %,
added TTFT p50 ≤ 1 ms.

Usage: git worktree add /tmp/redline-old <commit>
       .venv/bin/python bench/gateway_ab.py --a /tmp/redline-old --b . -n 6000
       (--a-env / --b-env: JSON of extra environment variables for that gateway;
       --json: the figures as JSON instead of the table)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_common import Procs, closed_loop, session, stream_once, summary  # noqa: E402

from redline.bench.loadgen import no_gc_pauses  # noqa: E402

TOKENS = 32  # per answer: the fake upstream streams max_tokens tokens
_ROUTE = re.compile(r"(?:^|,)\s*route;dur=([0-9.]+)")


def cpu_s(pid: int) -> float:
    """A process's user + system CPU time so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def route_ms(server_timing: str) -> float | None:
    m = _ROUTE.search(server_timing)
    return float(m.group(1)) if m else None


async def run(a: Path, b: Path, n: int, concurrency: int, a_env: dict[str, str],
              b_env: dict[str, str]) -> dict[str, Any]:
    procs = Procs()
    try:
        up = procs.upstream(ttft=0.0, tpot=0.02, tpot_jitter=0.01)
        models = [{"name": "m", "backend": "openai", "url": up}]
        urls, pids = {}, {}
        for side, tree, env in (("A", a, a_env), ("B", b, b_env)):
            urls[side] = procs.gateway(models, cwd=tree, env=env, routing={"classifier": "off"})
            pids[side] = procs.procs[-1].pid
        body = {"model": "m", "max_tokens": TOKENS, "messages": [{"role": "user", "content": "hi"}]}
        ttfts: dict[str, list[float]] = {"A": [], "B": []}
        routes: dict[str, list[float]] = {"A": [], "B": []}
        relayed = {"A": 0, "B": 0}  # answers whole, for the CPU per token
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
                    relayed[side] += r.ok
                    if counted and r.ok:
                        ttfts[side].append(r.ttft)
                        route = route_ms(r.headers.get("server-timing", ""))
                        if route is not None:
                            routes[side].append(route / 1000)
                    side = "B" if side == "A" else "A"

            cpu0 = {side: cpu_s(pid) for side, pid in pids.items()}
            with no_gc_pauses():
                await asyncio.gather(*(worker(i) for i in range(concurrency)))
            cpu = {side: cpu_s(pid) - cpu0[side] for side, pid in pids.items()}
        # the upstream alone, at the streams each gateway carried: what the gateways add
        direct = [r.ttft for r in await closed_loop(up, [body] * max(n // 2, 1),
                                                     max(concurrency // 2, 1),
                                                     warmup=2 * concurrency) if r.ok]
        out: dict[str, Any] = {side: summary(xs) for side, xs in ttfts.items()}
        out["direct"] = summary(direct)
        out["b_minus_a_ms"] = {q: (out["B"][q] - out["A"][q]) * 1000 for q in ("p50", "p90", "p99", "mean")}
        out["cpu_ms_per_token"] = {side: cpu[side] * 1000 / max(relayed[side] * TOKENS, 1)
                                   for side in ("A", "B")}
        out["route_ms"] = {side: {q: v * 1000 for q, v in summary(xs).items() if q != "n"}
                           for side, xs in routes.items()}
        out["added_ttft_ms"] = {side: {q: (out[side][q] - out["direct"][q]) * 1000
                                       for q in ("p50", "p99")} for side in ("A", "B")}
        return out
    finally:
        procs.stop()


def table(out: dict[str, Any]) -> str:
    """The figures, A (the baseline) next to B, with issue 24's limits."""
    a, b = out["A"], out["B"]
    d, cpu = out["b_minus_a_ms"], out["cpu_ms_per_token"]
    ratio = cpu["B"] / cpu["A"] - 1 if cpu["A"] else float("nan")
    rows = [
        ("requests counted", f"{a['n']}", f"{b['n']}", "", ""),
        ("TTFT p50 (ms)", f"{a['p50'] * 1000:.2f}", f"{b['p50'] * 1000:.2f}", f"{d['p50']:+.2f}", "≤ +0.15"),
        ("TTFT p90 (ms)", f"{a['p90'] * 1000:.2f}", f"{b['p90'] * 1000:.2f}", f"{d['p90']:+.2f}", ""),
        ("TTFT p99 (ms)", f"{a['p99'] * 1000:.2f}", f"{b['p99'] * 1000:.2f}", f"{d['p99']:+.2f}", "≤ +1"),
        ("CPU per relayed token (ms)", f"{cpu['A']:.4f}", f"{cpu['B']:.4f}", f"{ratio:+.1%}", "≤ +10 %"),
        ("route stage p50 (ms)", f"{out['route_ms']['A'].get('p50', float('nan')):.3f}",
         f"{out['route_ms']['B'].get('p50', float('nan')):.3f}", "", ""),
        ("added TTFT over direct p50 (ms)", f"{out['added_ttft_ms']['A']['p50']:.2f}",
         f"{out['added_ttft_ms']['B']['p50']:.2f}", "", "≤ 1 (each)"),
        ("added TTFT over direct p99 (ms)", f"{out['added_ttft_ms']['A']['p99']:.2f}",
         f"{out['added_ttft_ms']['B']['p99']:.2f}", "", ""),
    ]
    head = ("figure", "A (baseline)", "B", "B − A", "limit")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *rows]]
    lines.append(f"direct TTFT p50 / p99: {out['direct']['p50'] * 1000:.2f} / "
                 f"{out['direct']['p99'] * 1000:.2f} ms (n={out['direct']['n']})")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--a", type=Path, required=True, help="source tree of gateway A")
    p.add_argument("--b", type=Path, required=True, help="source tree of gateway B")
    p.add_argument("-n", type=int, default=6000)
    p.add_argument("-c", "--concurrency", type=int, default=64)
    p.add_argument("--a-env", default="{}")
    p.add_argument("--b-env", default="{}")
    p.add_argument("--json", action="store_true", help="the figures as JSON")
    args = p.parse_args()
    out = asyncio.run(run(args.a.resolve(), args.b.resolve(), args.n, args.concurrency,
                          json.loads(args.a_env), json.loads(args.b_env)))
    print(json.dumps(out, indent=2) if args.json else table(out))


if __name__ == "__main__":
    main()
