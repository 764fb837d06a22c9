"""Fuzzing with schemathesis, on a real socket (the hardened server, FakeBackend):
- every operation of redline's own /openapi.json, valid and invalid inputs;
- OpenAI's own chat-completions request schema (bench/resilience_openai_chat.json, a
  subset written from the public OpenAI spec), valid and invalid inputs.
Never a 5xx; every error in the OpenAI shape. REDLINE_FUZZ_EXAMPLES raises the count
(bench/resilience_fuzz.py), REDLINE_FUZZ_REPORT writes the tally as JSON."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from resilience_server import HardenedServer, fake_config
from schemathesis import GenerationMode
from starlette.routing import Match

ROOT = Path(__file__).resolve().parent.parent
OPENAI_SPEC = ROOT / "bench" / "resilience_openai_chat.json"
EXAMPLES = int(os.environ.get("REDLINE_FUZZ_EXAMPLES", "25"))
TALLY: Counter[str] = Counter()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HardenedServer]:
    with HardenedServer(fake_config(tmp_path_factory.mktemp("fuzz"))) as s:
        yield s
    report = os.environ.get("REDLINE_FUZZ_REPORT")
    if report:
        Path(report).write_text(json.dumps(dict(TALLY), indent=1))


def header(response: Any, name: str) -> str | None:
    values = response.headers.get(name)  # schemathesis: name -> list of values
    return values[0] if values else None


def check(response: Any, label: str) -> None:
    TALLY["cases"] += 1
    TALLY[f"status_{response.status_code // 100}xx"] += 1
    assert response.status_code < 500, f"{label}: {response.status_code} {response.text[:300]}"
    if response.status_code >= 400:
        assert (header(response, "content-type") or "").startswith("application/json"), label
        body = response.json()
        if label.endswith("/v1/messages"):  # Anthropic's Messages API: Anthropic's error shape
            assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, label
            assert isinstance(body["error"]["message"], str) and body["error"]["message"]
            return
        assert set(body) == {"error"}, f"{label}: {body}"
        assert set(body["error"]) == {"message", "type", "param", "code"}, f"{label}: {body}"
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
        if response.status_code in (429, 503):
            assert header(response, "retry-after"), label


def fuzz(schema: Any, base_url: str, *, pin_model: bool) -> None:
    session = requests.Session()
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode), known=st.booleans())
            def run(case: Any, known: bool) -> None:
                # half the valid requests name the served model, to reach generation
                if pin_model and known and isinstance(case.body, dict) and "model" in case.body:
                    case.body["model"] = "fake"
                response = case.call(base_url=base_url, session=session, timeout=30)
                check(response, f"{case.method} {case.path}")

            try:
                run()
            except Unsatisfiable:
                # no input to break (e.g. GET /healthz): nothing invalid to send
                assert mode is GenerationMode.NEGATIVE, op.label


def test_fuzz_redline_openapi(server: HardenedServer) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    assert len(list(schema.get_all_operations())) >= 3
    fuzz(schema, server.url, pin_model=True)


def test_fuzz_openai_chat_schema(server: HardenedServer) -> None:
    schema = schemathesis.openapi.from_dict(json.loads(OPENAI_SPEC.read_text()))
    fuzz(schema, server.url, pin_model=True)


def test_openapi_spec_is_published_and_accurate(server: HardenedServer) -> None:
    spec = requests.get(f"{server.url}/openapi.json", timeout=10).json()
    paths = spec["paths"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/healthz", "/readyz"):
        assert path in paths, path
    body = paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    ref = body["schema"]["$ref"].rsplit("/", 1)[-1]
    assert {"model", "messages"} <= set(spec["components"]["schemas"][ref]["required"])
    # the server really serves what the spec names
    for path, ops in paths.items():
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        for method in ops:
            scope = {"type": "http", "method": method.upper(), "path": concrete, "root_path": "",
                     "headers": [], "query_string": b""}
            matched = [r for r in server.app.router.routes if r.matches(scope)[0] is Match.FULL]
            assert matched, f"{method.upper()} {path} is in the spec but not served"
