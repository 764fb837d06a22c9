"""Two replicas sharing a real redis-server: a stream started on one is resumed
through the other, which follows the journal in Redis until [DONE]."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from conftest import ServerProcess, smol_config
from test_streams_resume import CHAT, _nth_end, _raw, _sse_text

from redline.api.app import create_app
from redline.backends.fake import FakeBackend
from redline.config import RedlineConfig

pytestmark = pytest.mark.slow


def _fake_replica(live_app, tmp_path, name: str, redis_url: str):
    cfg = RedlineConfig(server={"data_dir": str(tmp_path / name)}, store={"url": redis_url},
                        streams={"resume_grace_s": 0.5},
                        models=[{"name": "fake", "bundled": "fake"}])
    backend = FakeBackend(tpot_s=0.01, words=tuple(f"w{i}" for i in range(50)))
    return live_app(create_app(cfg, backends={"fake": backend})), backend


def test_resume_through_another_replica_keeps_the_first_one_generating(live_app, tmp_path,
                                                                       redis_url):
    (a, backend_a), (b, _) = (_fake_replica(live_app, tmp_path, n, redis_url) for n in "ab")
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 250}
    sid, head = _raw(a.url, body, cut_after=5)
    # 250 tokens x 10 ms: replica a generates ~2.5 s, far past its 0.5 s grace, because
    # the follower on b marks itself in Redis
    r = httpx.get(f"{b.url}/v1/streams/{sid}", headers={"Last-Event-ID": f"{sid}:5"}, timeout=30)
    assert r.status_code == 200
    joined = head + r.content
    assert backend_a.cancelled == 0
    assert joined.endswith(b"data: [DONE]\n\n")
    assert [int(s) for s in re.findall(rb"^id: [^:]+:(\d+)$", joined, re.M)] == list(
        range(1, joined.count(b"\n\n") + 1))
    # finished: either replica replays it whole, the same bytes
    assert httpx.get(f"{b.url}/v1/streams/{sid}", timeout=30).content == joined
    assert httpx.get(f"{a.url}/v1/streams/{sid}", timeout=30).content == joined
    assert httpx.get(f"{b.url}/v1/streams/strm-unknown", timeout=30).status_code == 404


def test_abandoned_stream_is_404_on_every_replica(live_app, tmp_path, redis_url):
    (a, backend_a), (b, _) = (_fake_replica(live_app, tmp_path, n, redis_url) for n in "ab")
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000}
    sid, _ = _raw(a.url, body, cut_after=3)
    deadline = time.monotonic() + 10
    while backend_a.cancelled == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend_a.cancelled == 1
    for replica in (a, b):
        r = httpx.get(f"{replica.url}/v1/streams/{sid}?after=3", timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_real_model_stream_resumed_through_another_replica(tmp_path, redis_url):
    cfg = smol_config(store={"url": redis_url}, streams={"resume_grace_s": 5})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = ServerProcess(cfg, tmp_path / "a").start()
    b = ServerProcess(cfg, tmp_path / "b").start()
    try:
        _, uninterrupted = _raw(a.url, CHAT)
        answer = _sse_text(uninterrupted)
        for k in (2, 9, 30):
            sid, head = _raw(a.url, CHAT, cut_after=k)
            r = httpx.get(f"{b.url}/v1/streams/{sid}", headers={"Last-Event-ID": f"{sid}:{k}"},
                          timeout=60)
            assert r.status_code == 200
            joined = head + r.content
            assert _sse_text(joined) == answer
            assert joined == httpx.get(f"{b.url}/v1/streams/{sid}", timeout=60).content
            assert r.content == joined[_nth_end(joined, k):]
    finally:
        a.stop()
        b.stop()
