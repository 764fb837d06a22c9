"""How long a client waits when the engine replica serving its stream dies (issue 25,
part 2): two fake upstream replicas (processes) behind one redline gateway (a process);
each replica cuts every stream after its answer's first `--die-at` pieces (connection
dropped, no [DONE], like a killed engine) and answers continuations, so every stream
migrates exactly once. Per stream, the gap between the last token before the death and
the first token after it (the death happens when the next token is due, so the gap
holds one normal inter-token time), next to the normal gaps of the same streams; and
whether the client's text is whole ("t1 ... tN", nothing lost or repeated).

Usage (the lead's quiet-machine run; `-n 5` checks that it runs):
    .venv/bin/python bench/stream_migration.py -n 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_common import Procs, free_port, session, summary  # noqa: E402


async def one(client: Any, url: str, body: dict[str, Any]) -> tuple[list[tuple[float, str]], str]:
    """One stream: (arrival time, text) of each token event, and any error message."""
    out: list[tuple[float, str]] = []
    error = ""
    async with client.post(f"{url}/v1/chat/completions", json={**body, "stream": True}) as r:
        pending = b""
        async for raw in r.content.iter_any():
            now = time.perf_counter()
            pending += raw
            *events, pending = pending.split(b"\n\n")
            for event in events:
                for line in event.split(b"\n"):
                    if not line.startswith(b"data: {"):
                        continue
                    payload = json.loads(line[6:])
                    if "error" in payload:
                        error = str(payload["error"].get("message"))
                    for choice in payload.get("choices") or ():
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            out.append((now, piece))
    return out, error


async def run(n: int, tokens: int, die_at: int, tpot: float, ttft: float,
              concurrency: int) -> dict[str, Any]:
    procs = Procs()
    try:
        ups = []
        for _ in range(2):
            port = free_port()
            ups.append(procs.start([sys.executable, "-m", "redline.backends.fake_upstream",
                                    "--port", str(port), "--numbered", "--die-at", str(die_at),
                                    "--tpot", str(tpot), "--ttft", str(ttft)],
                                   f"http://127.0.0.1:{port}"))
        gw = procs.gateway([{"name": "m", "backend": "openai", "urls": ups}],
                           routing={"classifier": "off", "hedge": False})
        expected = " ".join(f"t{k}" for k in range(1, tokens + 1))
        gaps: list[float] = []
        normal: list[float] = []
        whole = 0
        errors: list[str] = []
        sem = asyncio.Semaphore(concurrency)
        async with session(concurrency) as client:

            async def trial(i: int) -> None:
                nonlocal whole
                body = {"model": "m", "max_tokens": tokens, "messages": [
                    {"role": "user", "content": f"count to {tokens}, trial {i}"}]}
                async with sem:
                    got, error = await one(client, gw, body)
                if "".join(p for _, p in got) == expected and not error:
                    whole += 1
                elif error:
                    errors.append(error)
                times = [t for t, _ in got]
                for k in range(1, len(times)):
                    (gaps if k == die_at else normal).append(times[k] - times[k - 1])

            await asyncio.gather(*(trial(i) for i in range(n)))
        ms = {k: round(v * 1000, 2) if isinstance(v, float) else v for k, v in summary(gaps).items()}
        normal_ms = {k: round(v * 1000, 2) if isinstance(v, float) else v
                     for k, v in summary(normal).items()}
        return {"trials": n, "tokens": tokens, "die_at": die_at, "tpot_s": tpot, "ttft_s": ttft,
                "concurrency": concurrency, "whole_answers": whole, "errors": errors[:3],
                "gap_across_migration_ms": ms, "normal_gap_ms": normal_ms,
                "added_by_migration_ms_p50": round((ms["p50"] - normal_ms["p50"]), 2),
                "added_by_migration_ms_p99": round((ms["p99"] - normal_ms["p50"]), 2)}
    finally:
        procs.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=50, help="streams (each migrates once)")
    p.add_argument("--tokens", type=int, default=40)
    p.add_argument("--die-at", type=int, default=10, help="pieces before each replica death")
    p.add_argument("--tpot", type=float, default=0.02)
    p.add_argument("--ttft", type=float, default=0.02, help="the other replica's first token")
    p.add_argument("-c", "--concurrency", type=int, default=1)
    a = p.parse_args()
    print(json.dumps(asyncio.run(run(a.n, a.tokens, a.die_at, a.tpot, a.ttft, a.concurrency)),
                     indent=2))


if __name__ == "__main__":
    main()
