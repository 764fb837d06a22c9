"""A real Prometheus scrapes a real redline server; PromQL over its histograms returns
values, and every query of the Grafana dashboard is valid PromQL."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import SMOL, free_port, smol_config
from tests.test_telemetry_dashboard import dashboard_exprs

pytestmark = pytest.mark.slow

PROMETHEUS = "/usr/bin/prometheus"


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Any]:
    """`prometheus(target)` starts one scraping http://target/metrics every 0.5 s."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(target: str) -> str:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "500ms", "evaluation_interval": "500ms"},
            "scrape_configs": [{"job_name": "redline", "static_configs": [{"targets": [target]}]}],
        }))
        log = open(tmp_path / "prometheus.log", "wb")
        procs.append(subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError("prometheus did not become ready")

    yield start
    for p in procs:
        p.terminate()
        p.wait(timeout=30)


def query(url: str, expr: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body: dict[str, Any] = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    return body["data"]


def wait_for(url: str, expr: str, timeout: float = 30.0, count: int = 1) -> list[dict[str, Any]]:
    """The query's result once it has at least `count` series (scrapes come every 0.5 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = query(url, expr)["result"]
        if len(result) >= count:
            return result  # type: ignore[no-any-return]
        time.sleep(0.25)
    raise TimeoutError(f"no result for {expr}")


def test_prometheus_scrapes_and_answers_p99(server_factory: Any, prometheus: Any) -> None:
    server = server_factory(smol_config())
    prom = prometheus(f"127.0.0.1:{server.port}")
    wait_for(prom, 'up{job="redline"} == 1')
    with httpx.Client(base_url=server.url, timeout=60) as client:

        def ask(tier: str) -> None:
            r = client.post("/v1/chat/completions", json={
                "model": SMOL, "tier": tier, "max_tokens": 8,
                "messages": [{"role": "user", "content": "Say hi."}]})
            assert r.status_code == 200

        # rate() needs an increase between two scrapes of a series: make the series
        # exist, let Prometheus see them, then add the traffic that rate() measures
        ask("S"), ask("A")
        wait_for(prom, "redline_time_to_first_token_seconds_count", count=2)
        ask("S"), ask("A")
    p99 = wait_for(prom, "histogram_quantile(0.99, sum by (le, tier) "
                         "(rate(redline_time_to_first_token_seconds_bucket[1m]))) > 0", count=2)
    by_tier = {s["metric"]["tier"]: float(s["value"][1]) for s in p99}
    assert set(by_tier) == {"S", "A"}
    assert all(0 < v < 60 for v in by_tier.values())
    cpu = wait_for(prom, "redline_cpu_utilization")
    assert 0.0 <= float(cpu[0]["value"][1]) <= 1.0
    # every dashboard query parses and runs (Grafana's variables given plain values)
    for expr in dashboard_exprs():
        query(prom, expr.replace("$__rate_interval", "1m").replace("$__range", "5m"))
