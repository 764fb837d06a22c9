"""The semantic cache's embedder next to the embedded engine, A/B in one run.

Two redline servers on the bundled SmolLM2 with the default config (semantic cache on, so
all-MiniLM-L6-v2 runs in the same process as llama.cpp), one with `cache.embedder_threads:
1` (what an unset value resolves to next to a local model) and one with `0` (torch's
default: all cores). Each is driven in turn at concurrency 8, 64 output tokens each
(`ignore_eos`, bodies with `"cache": false`: the engine is measured, not the cache),
alternating the order every round. Prints total output tok/s, how busy the server's two
busiest threads (llama.cpp's) were, and the machine's idle time during the run.

    .venv/bin/python bench/engine_embedder.py [--rounds 3] [--requests 24]
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

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_bench import MODEL, body_maker  # noqa: E402  (bench/ is on the path)
from routing_common import free_port, wait_up  # noqa: E402

from redline.bench.loadgen import Target, run_closed  # noqa: E402
from redline.bench.report import summarize  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def start(tmp: Path, threads: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cfg = {"server": {"port": port, "data_dir": str(tmp / f"data-{port}")},
           "models": [{"name": MODEL, "bundled": MODEL, "n_seq_max": 8, "n_ctx": 2048}],
           "cache": {"embedder_threads": threads}, "streams": {"resume_grace_s": 0}}
    path = tmp / f"redline-{port}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "redline.cli", "serve", "--config", str(path)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_up(url, "/readyz", timeout=300)
    return proc, url


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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=24, help="per server and round")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="redline-embedder-"))
    servers = {}
    try:
        for threads in (1, 0):
            servers[threads] = start(tmp, threads)
        body = body_maker(64)
        extra = {"cache": False, "ignore_eos": True}
        for threads, (_, url) in servers.items():
            asyncio.run(run_closed(Target(str(threads), url, MODEL, extra=extra), body, 8, 8))
        rows: dict[int, list[tuple[float, float, float]]] = {1: [], 0: []}
        for r in range(args.rounds):
            for threads in (1, 0) if r % 2 == 0 else (0, 1):
                proc, url = servers[threads]
                before, idle0, t0 = thread_ticks(proc.pid), idle_ticks(), time.perf_counter()
                run = asyncio.run(run_closed(Target(str(threads), url, MODEL, extra=extra), body, 8,
                                             args.requests))
                wall = time.perf_counter() - t0
                after, idle1 = thread_ticks(proc.pid), idle_ticks()
                busy = sorted((after[t] - before.get(t, 0)) / TICKS / wall for t in after)[-2:]
                s = summarize(run)
                rows[threads].append((s.tok_s, statistics.mean(busy), (idle1 - idle0) / TICKS / wall))
                print(f"round {r}  embedder_threads={threads}  {s.tok_s:6.1f} tok/s  "
                      f"llama.cpp threads {busy[0]:.0%} / {busy[1]:.0%} busy  "
                      f"machine idle {(idle1 - idle0) / TICKS / wall:.0%} of a core", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()
    one, default = rows[1], rows[0]
    tok1, tok0 = statistics.mean(x[0] for x in one), statistics.mean(x[0] for x in default)
    print()
    for label, got, tok in (("1 (the default here)", one, tok1), ("0 (torch's)", default, tok0)):
        busy, idle = statistics.mean(x[1] for x in got), statistics.mean(x[2] for x in got)
        print(f"embedder_threads={label}: {tok:6.1f} tok/s, llama.cpp threads {busy:.0%} busy, "
              f"machine idle {idle:.0%} of a core")
    print(f"ratio: {tok1 / tok0:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
