"""The Grafana dashboard asks only for metrics the server exports, and has the panels
the latency board needs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from redline.api.app import create_app
from redline.backends.fake import FakeBackend
from redline.config import load_config
from redline.telemetry.hardware import GpuSample, HardwareCollector, HardwareSample

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "redline.json"
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("",), "gauge": ("",),
            "summary": ("", "_sum", "_count")}


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def exported_names(text: str) -> set[str]:
    """Every series name a scrape can hold, from the `# TYPE` lines (no traffic needed)."""
    names = set()
    for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M):
        name, kind = m.groups()
        names.update(name + s for s in SUFFIXES.get(kind, ("",)))
    return names


class _GpuHardware:
    def sample(self) -> HardwareSample:
        return HardwareSample(0.5, 0.5, 1, [GpuSample(0, "test gpu", 0.5, 0.5)])


def test_dashboard_metrics_are_exported(tmp_path: Path) -> None:
    cfg = load_config(server={"data_dir": str(tmp_path)}, cache={"enabled": False})
    app = create_app(cfg, backends={"fake": FakeBackend()})
    with TestClient(app) as client:
        text = client.get("/metrics").text
    names = exported_names(text)
    # GPU gauges are exported only where NVML sees a GPU: take them from the collector
    names |= {f.name for f in HardwareCollector(_GpuHardware()).collect()}  # type: ignore[arg-type]
    used = {n for e in dashboard_exprs() for n in re.findall(r"\b(redline_[a-z0-9_]+)", e)}
    assert len(used) >= 14
    assert used - names == set()


def test_dashboard_has_the_latency_board_panels() -> None:
    dash: dict[str, Any] = json.loads(DASHBOARD.read_text())
    exprs = " ".join(dashboard_exprs())
    for metric in ("redline_time_to_first_token_seconds", "redline_time_per_output_token_seconds",
                   "redline_e2e_request_latency_seconds"):
        assert f"histogram_quantile(0.99, sum by (le, tier) (rate({metric}_bucket" in exprs
        assert f"histogram_quantile(0.5, sum by (le, tier) (rate({metric}_bucket" in exprs
    titles = {p["title"] for p in dash["panels"]}
    for title in ("SLO attainment by tier", "Cache hit rate", "User interruption rate",
                  "Long-tail requests (over budget) per 5 min", "CPU utilisation", "GPU utilisation"):
        assert title in titles
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
