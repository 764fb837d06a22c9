"""Experiments through the in-process app on fake backends: the arm's model really
serves, the arm is in a header, and /v1/admin/experiments tells a slow arm apart."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from redline.api.app import create_app
from redline.backends.fake import FakeBackend
from redline.config import RedlineConfig
from redline.experiments.record import Recorder
from redline.types import Finished, GenerationRequest, SamplingParams


def make_app(tmp_path: Path) -> TestClient:
    cfg = RedlineConfig(server={"data_dir": str(tmp_path)}, store={"url": "memory://"},
                        cache={"enabled": False},
                        experiments={"active": [{"name": "ab", "arms": [
                            {"name": "fast", "model": "fast"},
                            {"name": "slow", "model": "slow"}]}]})
    backends = {"fast": FakeBackend("fast", ttft_s=0.0, tpot_s=0.0),
                "slow": FakeBackend("slow", ttft_s=0.03, tpot_s=0.002)}
    return TestClient(create_app(cfg, backends=backends))


def test_arms_serve_their_model_and_stats_separate_them(tmp_path: Path) -> None:
    with make_app(tmp_path) as client:
        deadline = time.monotonic() + 30
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        seen: dict[str, set[str]] = {}
        for i in range(60):
            for _ in range(2 if i < 5 else 1):  # a returning user keeps their arm
                r = client.post("/v1/chat/completions", json={
                    "model": "fast", "user": f"user-{i}", "max_tokens": 5, "stream": i % 2 == 0,
                    "messages": [{"role": "user", "content": f"question {i}"}]})
                assert r.status_code == 200, r.text
                arm = r.headers["x-redline-arm"]
                assert arm in ("ab:fast", "ab:slow")
                assert r.headers["x-redline-model"] == arm.split(":")[1]  # the override took effect
                seen.setdefault(f"user-{i}", set()).add(arm)
        assert all(len(arms) == 1 for arms in seen.values())
        body = client.get("/v1/admin/experiments").json()
        exp = body["experiments"][0]
        arms = {a["name"]: a for a in exp["arms"]}
        assert arms["fast"]["requests"] + arms["slow"]["requests"] == 65
        assert arms["fast"]["completed_rate"]["rate"] == 1.0
        assert arms["slow"]["ttft"]["p50"] > arms["fast"]["ttft"]["p50"]
        cmp = exp["comparisons"][0]
        assert cmp["control"] == "fast" and cmp["treatment"] == "slow"
        assert cmp["ttft"]["significant"] and cmp["e2e"]["significant"]
        assert not cmp["completed_rate"]["significant"]
        assert client.delete("/v1/admin/experiments/samples").status_code == 200
        assert client.get("/v1/admin/experiments").json()["experiments"][0]["arms"][0]["requests"] == 0


def test_no_experiment_no_header(tmp_path: Path) -> None:
    cfg = RedlineConfig(server={"data_dir": str(tmp_path)}, store={"url": "memory://"},
                        cache={"enabled": False})
    with TestClient(create_app(cfg, backends={"fake": FakeBackend()})) as client:
        while client.get("/readyz").status_code != 200:
            time.sleep(0.02)
        r = client.post("/v1/completions", json={"model": "fake", "prompt": "x", "user": "u"})
        assert r.status_code == 200 and "x-redline-arm" not in r.headers
        assert client.get("/v1/admin/experiments").json()["experiments"] == []


def completion(arm: str, status: str, finish: str | None, ttft: float = 0.1) -> Finished:
    req = GenerationRequest(model="m", prompt="p", sampling=SamplingParams())
    return Finished(req, "m", "S", "miss", status, finish, 5, ttft, ttft + 0.4, None, "",
                    {"total": ttft + 0.4}, arm)


def test_recorder_counts_interruptions_and_completions() -> None:
    rec = Recorder(100)
    for _ in range(3):
        rec.on_finish(completion("e:a", "200", "stop"))
    rec.on_finish(completion("e:a", "499", None))
    rec.on_finish(completion("e:a", "500", "error"))
    rec.on_finish(completion(None, "200", "stop"))  # type: ignore[arg-type]
    ttft, tpot, e2e, outcomes, _ = rec.copy("e:a")
    assert outcomes.count("completed") == 3 and outcomes.count("interrupted") == 1
    assert len(e2e) == 3 and len(tpot) == 3 and abs(tpot[0] - 0.1) < 1e-9 and len(ttft) == 5
    assert rec.copy("e:b") == ([], [], [], [], 0)
