"""Prometheus metrics (names in DESIGN.md). One `Metrics` per app, on its own
registry, so that two servers in one process (tests) never share counters.

`Metrics(enabled=False)` (config `telemetry.metrics: false`) hands out no-op metrics:
every `.labels(...).observe(...)` on the hot path becomes two attribute lookups and
a call that does nothing, and nothing is registered or scraped."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from redline.telemetry.hardware import Hardware, HardwareCollector

# fine below 300 ms, where cache hits and first tokens of small models live
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3,
                   0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2,
                 0.5, 1.0)
LABELS = ("tier", "model", "cache")
OFF_TEXT = b"# redline: metrics are off (telemetry.metrics: false)\n"


class _Noop:
    """Stands in for a Counter, Gauge or Histogram (and their children) when metrics are off."""

    def labels(self, *_: Any, **__: Any) -> _Noop:
        return self

    def observe(self, *_: Any) -> None:
        return None

    def inc(self, *_: Any) -> None:
        return None

    def dec(self, *_: Any) -> None:
        return None

    def set(self, *_: Any) -> None:
        return None


_NOOP = _Noop()


class Metrics:
    def __init__(self, enabled: bool = True, hardware: Hardware | None = None) -> None:
        self.enabled = enabled
        self.hardware = hardware or Hardware()
        r = self.registry = CollectorRegistry()
        if not enabled:
            self._noop()
            return
        self.ttft = Histogram("redline_time_to_first_token_seconds", "Time to first token",
                              LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("redline_time_per_output_token_seconds",
                              "Mean time per output token after the first", LABELS,
                              buckets=TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram("redline_e2e_request_latency_seconds", "Whole request latency",
                             LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("redline_queue_time_seconds", "Time waiting for an engine slot",
                               ("model",), buckets=LATENCY_BUCKETS, registry=r)
        self.stage = Histogram("redline_stage_seconds", "Time per pipeline stage", ("stage",),
                               buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter("redline_requests_total", "Requests by outcome", ("status",),
                                registry=r)
        self.output_tokens = Counter("redline_output_tokens_total", "Generated tokens", ("model",),
                                     registry=r)
        self.cache_lookups = Counter("redline_cache_lookups_total", "Response cache lookups",
                                     ("result",), registry=r)
        self.slo_violations = Counter("redline_slo_violations_total",
                                      "Requests over their tier's budget", ("tier",), registry=r)
        self.degradations = Counter("redline_degradations_total",
                                    "Requests the planner degraded because no model met the "
                                    "tier's budget (action: fastest, shorten, background)",
                                    ("tier", "action"), registry=r)
        self.stream_interruptions = Counter("redline_stream_interruptions_total",
                                            "Streams whose client went away", registry=r)
        self.stream_resumes = Counter("redline_stream_resumes_total", "Streams resumed",
                                      registry=r)
        self.jobs = Gauge("redline_jobs", "Jobs by status", ("status",), registry=r)
        self.backend_up = Gauge("redline_backend_up", "1 when a backend is serving", ("backend",),
                                registry=r)
        self.inflight = Gauge("redline_requests_in_flight", "Requests being served", registry=r)
        # sampled at scrape time, never on the request path
        r.register(HardwareCollector(self.hardware))
        ProcessCollector(registry=r)

    def watch_engines(self, stats: Callable[[], Mapping[str, Mapping[str, int]]]) -> None:
        """Export the embedded engines' counters, read at scrape time (`stats`: model ->
        the keys of EngineCollector.COUNTERS, and `slots_busy`)."""
        if self.enabled:
            self.registry.register(EngineCollector(stats))

    def _noop(self) -> None:
        for name in ("ttft", "tpot", "e2e", "queue", "stage", "requests", "output_tokens",
                     "cache_lookups", "slo_violations", "degradations", "stream_interruptions",
                     "stream_resumes", "jobs", "backend_up", "inflight"):
            setattr(self, name, _NOOP)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample's current value (0 when absent or when metrics are off)."""
        found = self.registry.get_sample_value(name, labels or {})
        return found if found is not None else 0.0

    def render(self) -> bytes:
        if not self.enabled:
            return OFF_TEXT
        return generate_latest(self.registry)


class EngineCollector(Collector):
    """The embedded engines' scheduler counters, per model: decode steps, preemptions (a
    sequence gave its slot to another: tier S over B, or a read stream over one nobody
    reads; it continues later), forgotten cached prefixes, the host prompt cache's saves and
    restores, prompts computed on the side (engine/side.py), and the slots and host-cache
    bytes in use now."""

    COUNTERS = {
        "steps": ("redline_engine_steps", "Decode steps run by the embedded engine"),
        "preemptions": ("redline_engine_preemptions",
                        "Sequences that gave their slot away and continued later"),
        "evictions": ("redline_engine_prefix_evictions",
                      "Cached prompt prefixes forgotten to bound the KV cells they hold"),
        "host_saves": ("redline_engine_host_cache_saves",
                       "Forgotten prompt prefixes copied to the host prompt cache"),
        "host_restores": ("redline_engine_host_cache_restores",
                          "Prompt prefixes copied back from the host cache instead of computed"),
        "host_restored_tokens": ("redline_engine_host_cache_restored_tokens",
                                 "Prompt tokens copied back from the host cache"),
        "side_prefills": ("redline_engine_side_prefills",
                          "Long prompts computed on the side while streams decoded"),
        "side_prefill_tokens": ("redline_engine_side_prefill_tokens",
                                "Prompt tokens computed on the side"),
    }
    GAUGES = {
        "slots_busy": ("redline_engine_slots_busy", "Sequences holding an engine slot now"),
        "host_bytes": ("redline_engine_host_cache_bytes", "Bytes the host prompt cache holds now"),
    }

    def __init__(self, stats: Callable[[], Mapping[str, Mapping[str, int]]]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        now = self.stats()
        for field, (name, doc) in self.COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=("model",))
            for model, values in now.items():
                family.add_metric((model,), values.get(field, 0))
            yield family
        for field, (name, doc) in self.GAUGES.items():
            gauge = GaugeMetricFamily(name, doc, labels=("model",))
            for model, values in now.items():
                gauge.add_metric((model,), values.get(field, 0))
            yield gauge
