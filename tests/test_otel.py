"""FastAPI traces requests natively once an OpenTelemetry SDK is set up, and looked for one
on every request; redline turns that look off where none is set up when the app is made
(api/app.py: otel_options), and keeps the spans where one is. In fresh processes: an
OpenTelemetry provider is set once per process."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import asyncio, json, sys
import httpx
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, INVALID_SPAN_CONTEXT

started = []

class Tracer(trace.Tracer):
    def start_span(self, name, context=None, kind=trace.SpanKind.INTERNAL, attributes=None,
                   links=None, start_time=None, record_exception=True, set_status_on_exception=True):
        started.append(name)
        return NonRecordingSpan(INVALID_SPAN_CONTEXT)

    def start_as_current_span(self, name, **kwargs):
        return trace.use_span(self.start_span(name), end_on_exit=True)

class Provider(trace.TracerProvider):
    def get_tracer(self, *args, **kwargs):
        return Tracer()

if sys.argv[1] == "sdk":
    trace.set_tracer_provider(Provider())

from redline.api.app import create_app
from redline.backends.fake import FakeBackend
from redline.config import RedlineConfig

cfg = RedlineConfig(server={"data_dir": sys.argv[2]}, store={"url": "memory://"},
                    cache={"enabled": False})
app = create_app(cfg, backends={"fake": FakeBackend("fake")})

async def main():
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            r = await c.get("/healthz")
    return r.status_code

status = asyncio.run(main())
print(json.dumps({"status": status, "spans": started}))
"""


def _run(mode: str, tmp: str) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode, tmp], capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_fastapi_spans_are_kept_when_a_provider_is_set(tmp_path) -> None:
    got = _run("sdk", str(tmp_path))
    assert got["status"] == 200
    assert "GET" in got["spans"]  # FastAPI's server span for the request


def test_without_a_provider_requests_are_served_and_nothing_is_traced(tmp_path) -> None:
    got = _run("none", str(tmp_path))
    assert got == {"status": 200, "spans": []}
