"""Answers while 20 % of upstream calls fail: two replicas of a fake upstream that
answers 500 to a fifth of its requests, behind redline with retries within a budget
(and breakers) and, in the same run, the same gateway with one attempt per request.
Usage: flock /tmp/redline-cpu.lock .venv/bin/python bench/routing_failures.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_common import Procs, closed_loop, summary, upstream_stats  # noqa: E402


async def run(n: int, concurrency: int, fail_rate: float) -> dict[str, object]:
    procs = Procs()
    try:
        ups = [procs.upstream(ttft=0.02, tpot=0.002, fail_rate=fail_rate, seed=s) for s in (1, 2)]
        model = [{"name": "m", "backend": "openai", "urls": ups}]
        gws = {"retries": procs.gateway(model),
               "no_retries": procs.gateway(model, routing={"max_attempts": 1})}
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}
        out: dict[str, object] = {"fail_rate": fail_rate}
        for name, url in gws.items():
            before = [await upstream_stats(u) for u in ups]
            res = await closed_loop(url, [body] * n, concurrency, {"X-Redline-Tier": "A"})
            after = [await upstream_stats(u) for u in ups]
            calls = sum(a["requests"] - b["requests"] for a, b in zip(after, before, strict=True))
            failed = sum(a["failed"] - b["failed"] for a, b in zip(after, before, strict=True))
            ok = [r for r in res if r.ok]
            out[name] = {"sent": n, "answered": len(ok), "answered_share": len(ok) / n,
                         "upstream_calls": calls, "upstream_failed_share": failed / calls,
                         "statuses": sorted({r.status for r in res}),
                         "ttft": summary([r.ttft for r in ok])}
        return out
    finally:
        procs.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, default=3000)
    p.add_argument("-c", "--concurrency", type=int, default=16)
    p.add_argument("--fail-rate", type=float, default=0.2)
    a = p.parse_args()
    print(json.dumps(asyncio.run(run(a.n, a.concurrency, a.fail_rate)), indent=2))


if __name__ == "__main__":
    main()
