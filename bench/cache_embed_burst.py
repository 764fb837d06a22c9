"""Questions that arrive together: the semantic cache embeds them in one pass (the
default, `cache.embed_batch: 32`) or one at a time (`embed_batch: 1`), two `redline
serve`s on the default config side by side, and llama-server on the same file if given.

    .venv/bin/python bench/cache_embed_burst.py --burst 4,8 --rounds 12 \\
        [--llama-server .bench-peer/build/bin/llama-server] [--cache-off] \\
        [--baseline-tree /tmp/base --no-single] [--no-skip --warm 64]

Each round sends `--burst` fresh one-line questions at once (engine_peer's short workload,
16 greedy tokens, streamed), waits for every answer, and goes to the next target (the order
alternates between rounds). Prints each target's first-token p50 and mean, and redline's
`cache` stage (the exact lookup, the embedding and the index search, from `Server-Timing`)
p50 and max: a burst's questions wait for each other at the embedder. `--cache-off` adds
redline with the cache off (what the lookup costs a burst); `--baseline-tree` adds the
default config run from an older tree, in the same rounds; `--no-skip` adds redline with
`cache.semantic_skip: false` (every question looked up, however little the lookup pays).
`--warm N` first sends N fresh questions one at a time to each redline (what it has seen
decides whether its lookup pays, cache/payoff.py); each redline's lookups by result (from
`/metrics`) are printed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_peer import (  # noqa: E402
    MODEL,
    ROOT,
    body_maker,
    find_or_build_llama_server,
    start_llama_server,
    start_redline,
)

from redline.models import bundled_path, served_path  # noqa: E402


async def one(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[float, float | None]:
    """(seconds to the first content, the cache stage's seconds or None)."""
    t0 = time.perf_counter()
    first: float | None = None
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        timing = r.headers.get("server-timing", "")
        async for line in r.aiter_lines():
            if first is None and '"content"' in line:
                first = time.perf_counter() - t0
    stages = dict(part.strip().split(";dur=") for part in timing.split(",") if ";dur=" in part)
    cache = float(stages["cache"]) / 1000 if "cache" in stages else None
    return first if first is not None else time.perf_counter() - t0, cache


async def warm(targets: dict[str, str], n: int) -> None:
    """`n` fresh questions, one at a time, to each redline (not llama-server)."""
    async with httpx.AsyncClient(timeout=120) as client:
        for name, url in targets.items():
            if name.startswith("redline"):
                body = body_maker("short", 16, f"warm{name}-{time.time()}-")
                for i in range(n):
                    await one(client, url, {**body(i), "model": MODEL, "stream": True})


def lookups(url: str) -> str:
    """`redline_cache_lookups_total` by result, from the server's /metrics."""
    counts = []
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("redline_cache_lookups_total{"):
            result = line.split('result="')[1].split('"')[0]
            counts.append(f"{result} {float(line.rsplit(' ', 1)[1]):.0f}")
    return ", ".join(counts) or "none"


async def measure(targets: dict[str, str], burst: int, rounds: int) -> dict[str, list[tuple[float, float | None]]]:
    out: dict[str, list[tuple[float, float | None]]] = {name: [] for name in targets}
    names = list(targets)
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as client:
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                body = body_maker("short", 16, f"burst{burst}r{r}{name}-{time.time()}-")
                bodies = [{**body(i), "model": MODEL, "stream": True} for i in range(burst)]
                out[name] += await asyncio.gather(*(one(client, targets[name], b) for b in bodies))
                await asyncio.sleep(0.3)  # the engine idle again between bursts
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--burst", default="4,8", help="questions sent at once, comma-separated")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--llama-server", default=None, help="also llama-server (a built binary)")
    ap.add_argument("--baseline-tree", default=None, help="also redline's default config run "
                    "from this source tree (a `git worktree` of an older commit)")
    ap.add_argument("--no-single", action="store_true", help="leave out `embed_batch: 1`")
    ap.add_argument("--no-skip", action="store_true", help="also redline with "
                    "`cache.semantic_skip: false`")
    ap.add_argument("--warm", type=int, default=0, help="fresh questions sent one at a time to "
                    "each redline before the bursts")
    ap.add_argument("--cache-off", action="store_true", help="also redline with `cache.enabled: false` "
                    "(what the semantic cache's lookup costs a burst)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="redline-burst-"))
    procs = []
    try:
        targets: dict[str, str] = {}

        def redline(name: str, yaml: str | None, tree: Path = ROOT) -> None:
            """One more `redline serve` in the rounds: the default config, or `yaml`'s."""
            config = None
            if yaml is not None:
                config = tmp / f"{len(targets)}.yaml"
                config.write_text(yaml)
            proc, url = start_redline(tmp, str(config) if config else None, tree)
            procs.append(proc)
            targets[name] = url

        redline("redline", None)
        if not args.no_single:
            redline("redline embed_batch 1", "cache:\n  embed_batch: 1\n")
        if args.baseline_tree:
            redline("redline, baseline tree", None, Path(args.baseline_tree).resolve())
        if args.no_skip:
            redline("redline semantic_skip false", "cache:\n  semantic_skip: false\n")
        if args.cache_off:
            redline("redline cache off", "cache:\n  enabled: false\n")
        if args.llama_server:
            binary = find_or_build_llama_server(args.llama_server)
            p3, peer = start_llama_server(binary, served_path(bundled_path(MODEL, ROOT / ".redline" / "models"),
                                                              "auto"))
            procs.append(p3)
            targets["llama-server"] = peer
        if args.warm:
            asyncio.run(warm(targets, args.warm))
        print("| burst | target | TTFT p50 | TTFT mean | cache stage p50 | cache stage max |")
        print("|---|---|---|---|---|---|")
        for burst in (int(b) for b in args.burst.split(",")):
            got = asyncio.run(measure(targets, burst, args.rounds))
            for name, samples in got.items():
                ttfts = [t * 1000 for t, _ in samples]
                caches = sorted(c * 1000 for _, c in samples if c is not None)
                stage = (f"{statistics.median(caches):.1f} ms | {caches[-1]:.1f} ms" if caches
                         else "— | —")
                print(f"| {burst} | {name} | {statistics.median(ttfts):.1f} ms | "
                      f"{statistics.mean(ttfts):.1f} ms | {stage} |", flush=True)
        for name, url in targets.items():
            if name.startswith("redline") and "cache off" not in name:
                print(f"{name}: lookups {lookups(url)}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
