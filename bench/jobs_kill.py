"""Jobs lost and notifications duplicated across random kill -9 runs.

    .venv/bin/python bench/jobs_kill.py [--runs 20] [--mode server|worker]

Each run: a client keeps submitting background jobs (webhook + e-mail notification)
while, at a random moment, a process is killed with SIGKILL:
  server: the `redline serve` that holds the SQLite queue and runs the jobs (embedded default);
  worker: one of two `redline worker` processes sharing a real redis-server.
Then the killed process is started again and every job that got a 202 must succeed.
Counted: jobs lost (accepted, not succeeded), webhook deliveries beyond one per job
(raw, and by distinct idempotency key), e-mails beyond one per job.
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import conftest  # noqa: E402
from jobs_support import (  # noqa: E402
    Proc,
    WebhookReceiver,
    redis_server,
    smtp_server,
    start_upstream,
    upstream_config,
)

FINAL = ("succeeded", "failed", "cancelled")


def submitter(url: str, notify: dict[str, str], accepted: list[str], stop: threading.Event,
              rng: random.Random) -> None:
    with httpx.Client(base_url=url, timeout=5) as c:
        while not stop.is_set():
            try:
                r = c.post("/v1/chat/completions", json={
                    "model": "up", "max_tokens": rng.randint(10, 60), "background": True,
                    "notify": notify, "messages": [{"role": "user", "content": "report"}]})
            except httpx.HTTPError:
                return  # the server is gone: what got a 202 is what counts
            if r.status_code == 202:
                accepted.append(r.json()["id"])
            time.sleep(rng.uniform(0.02, 0.2))


def settle(url: str, ids: list[str], timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    out: dict[str, str] = {}
    with httpx.Client(base_url=url, timeout=10) as c:
        while time.monotonic() < deadline:
            for i in ids:
                if out.get(i) not in FINAL:
                    out[i] = c.get(f"/v1/jobs/{i}").json()["status"]
            if all(s in FINAL for s in out.values()):
                break
            time.sleep(0.2)
    return out


def settle_notifications(url: str, ids: list[str], timeout: float) -> dict[str, int]:
    """Wait until no notification is pending or being sent (a sender killed mid-send
    leaves a claim that expires after one try's timeout); count the states."""
    deadline = time.monotonic() + timeout
    states: collections.Counter[str] = collections.Counter()
    with httpx.Client(base_url=url, timeout=10) as c:
        while True:
            states.clear()
            for i in ids:
                for s in c.get(f"/v1/jobs/{i}").json().get("notifications", {}).values():
                    states[s.split(":")[0]] += 1
            if not (states["pending"] or states["sending"]) or time.monotonic() > deadline:
                return dict(states)
            time.sleep(0.5)


def worker_proc(tmp: Path, cfg: dict[str, Any], name: str) -> Proc:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**cfg, "server": {"data_dir": str(tmp / name)}}))
    return Proc(["redline.cli", "worker", "--config", str(path)], tmp, name)


def one_run(n: int, mode: str, tmp: Path, base_cfg: dict[str, Any], hook: WebhookReceiver,
            rng: random.Random) -> tuple[int, list[str]]:
    notify = {"webhook": hook.url, "email": f"run{n}@example.com"}
    workers: dict[str, Proc] = {}
    if mode == "server":
        server = conftest.ServerProcess(base_cfg, tmp).start()
    else:
        server = conftest.ServerProcess(
            {**base_cfg, "jobs": {**base_cfg["jobs"], "worker_in_server": False}}, tmp).start()
        workers = {w: worker_proc(tmp, base_cfg, w) for w in ("w1", "w2")}
    accepted: list[str] = []
    stop = threading.Event()
    t = threading.Thread(target=submitter, args=(server.url, notify, accepted, stop, rng))
    t.start()
    time.sleep(rng.uniform(0.3, 3.0))
    if mode == "server":
        server.stop(signal.SIGKILL)
        stop.set()
        t.join()
        server = conftest.ServerProcess(base_cfg, tmp).start()
    else:
        victim = rng.choice(sorted(workers))
        workers[victim].stop(signal.SIGKILL)
        stop.set()
        t.join()
        workers[victim] = worker_proc(tmp, base_cfg, victim + "b")
    try:
        final = settle(server.url, accepted, timeout=120)
        notes = settle_notifications(server.url, accepted, timeout=120)
        if notes.get("pending") or notes.get("sending") or notes.get("failed"):
            print(f"  notifications not settled: {notes}", flush=True)
    finally:
        server.stop()
        for w in workers.values():
            w.stop()
    lost = sum(1 for s in final.values() if s != "succeeded")
    return lost, accepted


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--mode", choices=("server", "worker"), default="server")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    root = Path(tempfile.mkdtemp(prefix="jobs-kill-"))
    up, url = start_upstream(root, tpot=0.01)
    total_lost = total_jobs = 0
    all_ids: list[str] = []
    try:
        with WebhookReceiver() as hook, smtp_server() as (mail, smtp_port), \
                redis_server(root) as redis_url:
            cfg = upstream_config(url, concurrency=2, lease_s=2,
                                  smtp={"host": "127.0.0.1", "port": smtp_port, "tls": "none"})
            for n in range(a.runs):
                run_tmp = root / f"run{n}"
                run_tmp.mkdir()
                run_cfg = cfg if a.mode == "server" else {
                    **cfg, "store": {"url": redis_url.replace("/0", f"/{n % 16}")}}
                lost, ids = one_run(n, a.mode, run_tmp, run_cfg, hook, rng)
                total_lost += lost
                total_jobs += len(ids)
                all_ids += ids
                print(f"run {n:2d}: accepted {len(ids):3d}, lost {lost}", flush=True)
            time.sleep(5)  # past a lease: late re-sends would show now
            keys = collections.Counter(hook.keys())
            mails = collections.Counter(
                m.group(1).decode() for _, raw in mail.messages
                for m in [re.search(rb"Message-ID: <([^@]+)@redline>", raw)] if m)
    finally:
        up.stop()
    want = set(all_ids)
    print(f"\nmode={a.mode} runs={a.runs} jobs accepted={total_jobs} jobs lost={total_lost}")
    print(f"webhooks: delivered for {len(want & set(keys))}/{len(want)} jobs, "
          f"duplicate deliveries={sum(keys[i] - 1 for i in want if keys[i] > 1)}")
    print(f"e-mails:  delivered for {len(want & set(mails))}/{len(want)} jobs, "
          f"duplicates={sum(mails[i] - 1 for i in want if mails[i] > 1)}")


if __name__ == "__main__":
    main()
