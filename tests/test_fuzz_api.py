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
        if label.split()[-1].startswith("/v1/messages"):  # Anthropic's API: its error shape
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


# -- hostile JSON: invalid Unicode, huge numbers, deep nesting ---------------------------
NUMBER_FIELDS = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "seed",
                 "presence_penalty", "frequency_penalty", "top_logprobs")
HUGE = ("1e400", "-1e400", "1e-400", "1" + "0" * 400, "-" + "9" * 5000, "NaN", "Infinity",
        "-0", "0.0000000000000000000001", "18446744073709551616", "-9223372036854775809")


@st.composite
def bad_text(draw: st.DrawFn) -> bytes:
    """A JSON string literal with what is not UTF-8 text: lone surrogate escapes, raw
    bytes that are not UTF-8, UTF-8-encoded surrogates, NUL and control escapes."""
    parts = draw(st.lists(st.one_of(
        st.integers(0xD800, 0xDFFF).map(lambda u: f"\\u{u:04x}".encode()),
        st.sampled_from([b"\xff", b"\xfe", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                         b"\\u0000", b"\\ud83d\\ude00", b"\\u00e9"]),
        st.text(max_size=5).map(lambda t: json.dumps(t)[1:-1].encode())), min_size=1, max_size=6))
    return b'"' + b"".join(parts) + b'"'


@st.composite
def deep(draw: st.DrawFn) -> bytes:
    n = draw(st.sampled_from([64, 500, 5000, 200_000]))
    if draw(st.booleans()):
        return b"[" * n + b"]" * n
    return b'{"a":' * n + b"1" + b"}" * n


@st.composite
def hostile_body(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
    text = draw(st.one_of(bad_text(), st.just(b'"hi"')))
    if path == "/v1/chat/completions":
        base = b'{"model":"fake","messages":[{"role":"user","content":%s}]' % text
    else:
        base = b'{"model":"fake","prompt":%s' % text
    extra = draw(st.lists(st.one_of(
        st.tuples(st.sampled_from(NUMBER_FIELDS).map(str.encode), st.sampled_from(HUGE).map(str.encode)),
        st.tuples(st.sampled_from([b"metadata", b"stop", b"user", b"logit_bias", b"tools"]),
                  st.one_of(deep(), bad_text())),
        st.tuples(bad_text().map(lambda b: b[1:-1]), st.just(b"1"))), max_size=3))
    body = base + b"".join(b',"%s":%s' % (k, v) for k, v in extra)
    if draw(st.booleans()):
        body += b',"stream":true'
    return path, body + b"}"


def check_plain(response: requests.Response, label: str) -> None:
    TALLY["hostile"] += 1
    assert response.status_code < 500, f"{label}: {response.status_code} {response.text[:300]}"
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith("application/json"), label
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, f"{label}: {error}"


def test_fuzz_hostile_json(server: HardenedServer) -> None:
    """Never a 5xx for invalid Unicode, huge or non-finite numbers, or deep nesting,
    wherever in the body they are; errors in the OpenAI shape."""
    session = requests.Session()

    @settings(max_examples=EXAMPLES * 4, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=hostile_body())
    def run(case: tuple[str, bytes]) -> None:
        path, body = case
        r = session.post(server.url + path, data=body, timeout=30,
                         headers={"content-type": "application/json"})
        check_plain(r, f"{path} {body[:200]!r}")

    run()


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(after=st.text(min_size=1, max_size=6))
def test_fuzz_stream_after(server: HardenedServer, after: str) -> None:
    """`?after=` of any text, Unicode digits included, is a 400 or a 404, never a 500."""
    r = requests.get(f"{server.url}/v1/streams/strm-{'0' * 24}", params={"after": after},
                     timeout=30)
    check_plain(r, f"after={after!r}")
