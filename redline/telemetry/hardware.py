"""Hardware utilisation: CPU and memory through psutil, GPUs through NVML when a GPU
and the optional `pynvml` module (package nvidia-ml-py) are there; without them the
GPU gauges are simply absent.

Sampled on demand (a scrape, a dashboard poll), never on the request path. CPU
utilisation is the busy share of all cores since the previous sample; samples closer
together than `min_interval_s` reuse the last value, so that two pollers (Prometheus
and the dashboard) do not shorten each other's window to nothing."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


@dataclass
class GpuSample:
    index: int
    name: str
    utilization: float  # 0..1, share of the last sample period the GPU was busy
    memory_utilization: float  # 0..1, used / total memory


@dataclass
class HardwareSample:
    cpu_utilization: float  # 0..1 over all cores
    memory_utilization: float  # 0..1 of system memory in use
    process_rss_bytes: int
    gpus: list[GpuSample] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"cpu_utilization": round(self.cpu_utilization, 4),
                "memory_utilization": round(self.memory_utilization, 4),
                "process_rss_bytes": self.process_rss_bytes,
                "gpus": [g.__dict__ for g in self.gpus]}


class Hardware:
    def __init__(self, min_interval_s: float = 0.5) -> None:
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._process = psutil.Process()
        self._last_times = psutil.cpu_times()
        self._last_at = time.monotonic()
        self._cpu = 0.0
        self._nvml = _Nvml.open()

    def sample(self) -> HardwareSample:
        with self._lock:
            now = time.monotonic()
            if now - self._last_at >= self.min_interval_s:
                times = psutil.cpu_times()
                self._cpu = _busy_share(self._last_times, times)
                self._last_times, self._last_at = times, now
            cpu = self._cpu
        mem = psutil.virtual_memory()
        gpus = self._nvml.sample() if self._nvml is not None else []
        return HardwareSample(cpu, mem.percent / 100.0, self._process.memory_info().rss, gpus)


def _busy_share(before: Any, after: Any) -> float:
    idle_fields = ("idle", "iowait")
    total = float(sum(after) - sum(before))
    if total <= 0:
        return 0.0
    idle = float(sum(getattr(after, f, 0.0) - getattr(before, f, 0.0) for f in idle_fields))
    return min(1.0, max(0.0, 1.0 - idle / total))


class _Nvml:
    """The NVML handles, or None from `open()` when there is no GPU or no pynvml."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self.nvml, self.handles = nvml, handles
        self.names = [_text(nvml.nvmlDeviceGetName(h)) for h in handles]

    @classmethod
    def open(cls) -> _Nvml | None:
        try:
            import pynvml  # optional: pip install nvidia-ml-py
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as exc:  # no driver, no device: no GPU gauges
            log.info("no GPU metrics: %s", exc)
            return None
        return cls(pynvml, handles) if handles else None

    def sample(self) -> list[GpuSample]:
        out = []
        for i, h in enumerate(self.handles):
            try:
                util = self.nvml.nvmlDeviceGetUtilizationRates(h)
                mem = self.nvml.nvmlDeviceGetMemoryInfo(h)
            except self.nvml.NVMLError as exc:
                log.warning("GPU %d: %s", i, exc)
                continue
            out.append(GpuSample(i, self.names[i], util.gpu / 100.0,
                                 mem.used / mem.total if mem.total else 0.0))
        return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class HardwareCollector(Collector):
    """Exports `redline_cpu_utilization`, `redline_memory_utilization` and, with a GPU,
    `redline_gpu_utilization{gpu}` and `redline_gpu_memory_utilization{gpu}` (all 0..1)."""

    def __init__(self, hardware: Hardware) -> None:
        self.hardware = hardware

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self.hardware.sample()
        yield GaugeMetricFamily("redline_cpu_utilization", "Busy share of all CPU cores (0..1)",
                                value=s.cpu_utilization)
        yield GaugeMetricFamily("redline_memory_utilization", "Share of system memory in use (0..1)",
                                value=s.memory_utilization)
        if s.gpus:
            util = GaugeMetricFamily("redline_gpu_utilization", "GPU busy share (0..1)",
                                     labels=("gpu", "name"))
            mem = GaugeMetricFamily("redline_gpu_memory_utilization",
                                    "Share of GPU memory in use (0..1)", labels=("gpu", "name"))
            for g in s.gpus:
                util.add_metric((str(g.index), g.name), g.utilization)
                mem.add_metric((str(g.index), g.name), g.memory_utilization)
            yield util
            yield mem
