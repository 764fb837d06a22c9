"""A/B (or A/A) experiment through a real `redline serve`, driven by redline.bench.loadgen.

Starts a server whose config splits users between two arms (each arm a model), sends
`--requests` streamed chat requests from distinct users, then prints what
GET /v1/admin/experiments says: per-arm TTFT / TPOT / E2E with 95% intervals and the
significance tests. With --aa both arms serve the same model: the tests should not
tell them apart.

    flock /tmp/redline-cpu.lock .venv/bin/python bench/ab_experiment.py \\
        --b /path/to/SmolLM2.F16.gguf --requests 80 --json /tmp/ab.json
    flock /tmp/redline-cpu.lock .venv/bin/python bench/ab_experiment.py --aa --requests 80
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from redline.bench.loadgen import Body, Target, run_closed

SMOL = "smollm2-135m-instruct"
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(args: argparse.Namespace, data_dir: str, port: int) -> dict[str, Any]:
    models: list[dict[str, Any]] = [{"name": "a", "bundled": SMOL, "n_seq_max": 4}]
    arm_b = "a"
    if not args.aa:
        models.append({"name": "b", "path": args.b, "n_seq_max": 4} if args.b
                      else {"name": "b", "bundled": args.b_bundled, "n_seq_max": 4})
        arm_b = "b"
    return {"server": {"port": port, "data_dir": data_dir, "log_level": "warning"},
            "models": models, "cache": {"enabled": False},
            "experiments": {"active": [{"name": "aa" if args.aa else "ab", "unit": "user", "arms": [
                {"name": "control", "model": "a"}, {"name": "treatment", "model": arm_b}]}]}}


def make_body(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    filler = ("You answer questions for a travel desk. Be brief, friendly and concrete, "
              "and mention one practical tip. ") * args.system_repeat

    def body(i: int) -> Body:
        # the request number leads the system prompt: no prefix reuse, no cache hits
        return {"messages": [{"role": "system", "content": f"Ticket {i}. {filler}"},
                             {"role": "user", "content": f"Trip {i}: what should I pack?"}],
                "max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True,
                "user": f"user-{i}"}

    return body


def summary(snapshot: dict[str, Any]) -> str:
    exp = snapshot["experiments"][0]
    lines = [f"experiment {exp['name']} (alpha {snapshot['alpha']})",
             "arm        n   TTFT ms p50 (mean 95% CI)        TPOT ms p50   E2E ms p50   completed"]
    for a in exp["arms"]:
        t, tp, e = a["ttft"], a["tpot"], a["e2e"]
        ms = lambda x: "-" if x is None else f"{x * 1000:.0f}"  # noqa: E731
        lines.append(f"{a['name']:<10} {a['requests']:<3} {ms(t['p50'])} ({ms(t['mean'])} "
                     f"[{ms(t['ci'][0])}, {ms(t['ci'][1])}])   {ms(tp['p50'])}   {ms(e['p50'])}   "
                     f"{a['completed_rate']['rate']}")
    for c in exp["comparisons"]:
        for m in ("ttft", "tpot", "e2e"):
            r = c[m]
            lines.append(f"{m}: Mann-Whitney p={r['p_value']} significant={r['significant']} "
                         f"median ratio={r.get('median_ratio')} Welch p={r.get('welch_p_value')}")
        r = c["completed_rate"]
        lines.append(f"completed rate: {r['test']} p={r['p_value']} significant={r['significant']}")
    return "\n".join(lines)


async def drive(url: str, args: argparse.Namespace) -> dict[str, Any]:
    target = Target("experiment", url, "a")
    body = make_body(args)
    await run_closed(target, lambda i: body(100000 + i), 1, 2)  # warm, then count afresh
    async with httpx.AsyncClient() as c:
        await c.delete(f"{url}/v1/admin/experiments/samples")
    res = await run_closed(target, body, args.concurrency, args.requests)
    failed = [s.error for s in res.samples if not s.ok]
    if failed:
        print(f"{len(failed)} failed, first: {failed[0]}", file=sys.stderr)
    async with httpx.AsyncClient() as c:
        return (await c.get(f"{url}/v1/admin/experiments")).json()  # type: ignore[no-any-return]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--aa", action="store_true", help="both arms serve the bundled SmolLM2")
    p.add_argument("--b", help="treatment arm: a .gguf file (e.g. a `redline optimize` variant)")
    p.add_argument("--b-bundled", default="gemma3-270m", help="treatment arm: a bundled model")
    p.add_argument("--requests", type=int, default=80)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--system-repeat", type=int, default=8, help="system prompt length, x ~18 tokens")
    p.add_argument("--json", help="write the /v1/admin/experiments snapshot here")
    args = p.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path = Path(tmp, "redline.yaml")
        cfg_path.write_text(yaml.safe_dump(config(args, tmp, port)))
        log = open(Path(tmp, "server.log"), "wb")
        proc = subprocess.Popen([sys.executable, "-m", "redline.cli", "serve", "--config", str(cfg_path)],
                                cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=log,
                                stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 240
            while True:
                try:
                    if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    tail = Path(tmp, "server.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"server did not become ready:\n{tail}")
                time.sleep(0.2)
            snapshot = asyncio.run(drive(url, args))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(summary(snapshot))
    if args.json:
        Path(args.json).write_text(json.dumps(snapshot, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
