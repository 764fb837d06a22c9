"""Metrics: the names of DESIGN.md, the off switch, hardware gauges."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from redline.api.app import create_app
from redline.backends.fake import FakeBackend
from redline.config import load_config
from redline.telemetry.hardware import Hardware, HardwareCollector
from redline.telemetry.metrics import Metrics

DESIGN_NAMES = [
    "redline_time_to_first_token_seconds", "redline_time_per_output_token_seconds",
    "redline_e2e_request_latency_seconds", "redline_queue_time_seconds", "redline_stage_seconds",
    "redline_requests", "redline_cache_lookups", "redline_slo_violations",
    "redline_stream_interruptions", "redline_stream_resumes", "redline_jobs", "redline_backend_up",
    "redline_cpu_utilization",
]


def families(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_every_design_metric_is_exported() -> None:
    found = families(Metrics().render().decode())
    missing = [n for n in DESIGN_NAMES if n not in found]
    assert not missing
    assert found["redline_time_to_first_token_seconds"] == "histogram"
    assert found["redline_memory_utilization"] == "gauge"


def test_off_metrics_offer_every_attribute_and_record_nothing() -> None:
    on, off = Metrics(), Metrics(enabled=False)
    names = [n for n, v in vars(on).items() if hasattr(v, "labels") or hasattr(v, "inc")]
    assert len(names) >= 14
    for name in names:
        metric = getattr(off, name)
        metric.labels("S", "m", "miss").observe(1.0)
        metric.inc()
        metric.dec()
        metric.set(1)
    assert list(off.registry.collect()) == []
    assert off.value("redline_requests_total", {"status": "200"}) == 0.0


def test_config_metrics_false_turns_recording_off(tmp_path: Path) -> None:
    cfg = load_config(server={"data_dir": str(tmp_path)}, telemetry={"metrics": False},
                      cache={"enabled": False})
    app = create_app(cfg, backends={"fake": FakeBackend()})
    with TestClient(app) as client:
        while client.get("/readyz").status_code != 200:
            time.sleep(0.01)
        r = client.post("/v1/chat/completions", json={
            "model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert r.status_code == 200
        assert "redline_" not in client.get("/metrics").text.replace("redline:", "")
        stats = client.get("/v1/admin/stats").json()
        assert stats["metrics_enabled"] is False and stats["live"] is None


def test_hardware_gauges_without_gpu_skip_cleanly() -> None:
    hw = Hardware(min_interval_s=0.0)
    sum(i * i for i in range(200_000))  # some CPU time between two samples
    sample = hw.sample()
    assert 0.0 <= sample.cpu_utilization <= 1.0
    assert 0.0 < sample.memory_utilization < 1.0
    assert sample.process_rss_bytes > 0
    names = [f.name for f in HardwareCollector(hw).collect()]
    assert names[:2] == ["redline_cpu_utilization", "redline_memory_utilization"]
    # GPU gauges appear exactly when NVML reports a device (none on this machine)
    assert ("redline_gpu_utilization" in names) == bool(sample.gpus)


def test_engine_counters_are_read_at_scrape_time() -> None:
    now = {"smol": {"steps": 10, "preemptions": 2, "evictions": 1, "slots_busy": 3,
                    "host_restores": 4, "host_bytes": 1 << 20}}
    m = Metrics()
    m.watch_engines(lambda: now)
    assert m.value("redline_engine_preemptions_total", {"model": "smol"}) == 2
    now["smol"]["preemptions"] = 5  # a later scrape sees the engine's count now
    assert m.value("redline_engine_preemptions_total", {"model": "smol"}) == 5
    assert m.value("redline_engine_steps_total", {"model": "smol"}) == 10
    assert m.value("redline_engine_slots_busy", {"model": "smol"}) == 3
    assert m.value("redline_engine_host_cache_restores_total", {"model": "smol"}) == 4
    assert m.value("redline_engine_host_cache_bytes", {"model": "smol"}) == 1 << 20
    assert m.value("redline_engine_host_cache_saves_total", {"model": "smol"}) == 0
    now["smol"]["side_prefills"], now["smol"]["side_prefill_tokens"] = 2, 2900
    assert m.value("redline_engine_side_prefills_total", {"model": "smol"}) == 2
    assert m.value("redline_engine_side_prefill_tokens_total", {"model": "smol"}) == 2900
    off = Metrics(enabled=False)
    off.watch_engines(lambda: now)  # nothing registered, nothing scraped
    assert b"redline_engine" not in off.render()
