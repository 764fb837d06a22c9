"""A background response survives `kill -9` of the server running it: the restarted
server (same data dir: the SQLite job book and queue) runs it again once its lease runs
out, and it ends completed (or failed, with an error), never `in_progress` forever."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from jobs_support import start_upstream, upstream_config, wait_until

pytestmark = pytest.mark.slow
TOKENS = 100  # at 20 ms a token: it runs about two seconds
AUTH = {"Authorization": "Bearer key-a"}


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[str]:
    proc, url = start_upstream(tmp_path)
    yield url
    proc.stop()


def _status(c: httpx.Client, rid: str) -> str:
    r = c.get(f"/v1/responses/{rid}")
    assert r.status_code == 200, r.text
    return str(r.json()["status"])


def test_kill_9_mid_run_and_the_restarted_server_finishes_it(server_factory: Any,
                                                            upstream: str) -> None:
    cfg = upstream_config(upstream, concurrency=1)  # lease_s 2
    first = server_factory(cfg)
    with httpx.Client(base_url=first.url, timeout=30, headers=AUTH) as c:
        r = c.post("/v1/responses", json={"model": "up", "input": "a report",
                                          "max_output_tokens": TOKENS, "background": True})
        assert r.status_code == 200, r.text
        accepted = r.json()
        rid = accepted["id"]
        assert accepted["status"] == "queued"
        wait_until(lambda: _status(c, rid) == "in_progress")
        time.sleep(0.3)  # mid-run
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL

    second = server_factory(cfg)  # same data dir: the job book and queue survived
    with httpx.Client(base_url=second.url, timeout=30, headers=AUTH) as c:
        seen = {_status(c, rid)}
        assert seen <= {"queued", "in_progress"}  # known at once, still open
        deadline = time.monotonic() + 90
        while (status := _status(c, rid)) in ("queued", "in_progress"):
            assert time.monotonic() < deadline, "left in_progress"
            time.sleep(0.1)
        done = c.get(f"/v1/responses/{rid}").json()
        assert status == "incomplete", done  # ran to its max_output_tokens
        assert done["output_text"] == " ".join(["tok"] * TOKENS)
        assert done["usage"]["output_tokens"] == TOKENS
        assert done["created_at"] == accepted["created_at"]
        # the worker writes the job's outcome just after the response's end: wait for it
        wait_until(lambda: c.get(f"/v1/jobs/{rid}").json()["status"] != "running")
        job = c.get(f"/v1/jobs/{rid}").json()
        assert job["status"] == "succeeded" and job["result"]["id"] == rid  # one result
        # its stream (the second run's) replays whole from the restarted server
        replay = c.get(f"/v1/responses/{rid}", params={"stream": "true"})
        events = [json.loads(e.split(b"data: ", 1)[1])
                  for e in replay.content.split(b"\n\n")[:-2]]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[-1]["type"] == "response.incomplete"
        assert events[-1]["response"]["output_text"] == done["output_text"]
