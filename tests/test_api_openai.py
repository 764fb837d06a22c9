"""The official `openai` client against a real server process on the real bundled model."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from conftest import SMOL, smol_config

pytestmark = pytest.mark.slow

MSG = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(smol_server):
    return openai.OpenAI(base_url=f"{smol_server.url}/v1", api_key="unused", max_retries=0)


def test_models_lists_configured_and_auto(client):
    ids = {m.id for m in client.models.list().data}
    assert {SMOL, "auto"} <= ids


def test_models_retrieve_one_and_404_for_unknown(client):
    m = client.models.retrieve(SMOL)
    assert m.id == SMOL and m.object == "model" and "chat" in m.capabilities  # type: ignore[attr-defined]
    # vLLM's max_model_len: the context a prompt and its answer must fit (the server's
    # config), on the embedded model only
    assert m.max_model_len == smol_config()["models"][0].get("n_ctx", 2048)  # type: ignore[attr-defined]
    assert not hasattr(client.models.retrieve("auto"), "max_model_len")
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"


def test_chat_non_stream_with_usage_and_headers(client):
    raw = client.chat.completions.with_raw_response.create(
        model=SMOL, messages=MSG, temperature=0, max_tokens=16)
    r = raw.parse()
    assert r.object == "chat.completion"
    # not the answer's words: its first token is a near tie for SmolLM2 ('The' -1.85 and
    # 'L' -1.97 in one KV layout, the other way round in another), which is the model's
    assert (r.choices[0].message.content or "").strip()
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5 and 0 < r.usage.completion_tokens <= 16
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    h = raw.headers
    assert h["x-request-id"] and h["x-redline-model"] == SMOL
    assert h["x-redline-cache"] in ("miss", "bypass", "hit", "semantic")
    stages = {p.split(";")[0].strip() for p in h["server-timing"].split(",")}
    assert {"queue", "tokenize", "prefill", "decode", "detokenize", "total"} <= stages


def test_stream_equals_non_stream_at_temperature_zero(client):
    kw = dict(model=SMOL, messages=[{"role": "user", "content": "Write two sentences about cats."}],
              temperature=0, max_tokens=40)
    full = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                 **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert [c for c in chunks if c.choices][-1].choices[0].finish_reason in ("stop", "length")


def test_stream_events_carry_ids_and_stream_id_header(smol_server):
    body = {"model": SMOL, "messages": MSG, "max_tokens": 5, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{smol_server.url}/v1/chat/completions", json=body, timeout=60) as r:
        sid = r.headers["x-redline-stream-id"]
        lines = [ln for ln in r.iter_lines() if ln]
    ids = [ln[4:] for ln in lines if ln.startswith("id: ")]
    data = [ln[6:] for ln in lines if ln.startswith("data: ")]
    assert len(ids) == len(data) and data[-1] == "[DONE]"
    assert ids == [f"{sid}:{i}" for i in range(1, len(ids) + 1)]


def test_legacy_completions(client):
    r = client.completions.create(model=SMOL, prompt="The capital of France is", max_tokens=8,
                                  temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    chunks = list(client.completions.create(model=SMOL, prompt="The capital of France is",
                                            max_tokens=8, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text


@pytest.mark.parametrize("kw,param", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"messages": []}, "messages"),
])
def test_out_of_range_fields_are_400_with_param(client, kw, param):
    args = {"model": SMOL, "messages": MSG, **kw}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**args)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param
    assert e.value.body["type"] == "invalid_request_error"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=MSG)
    assert e.value.body["code"] == "model_not_found"


def test_context_length_exceeded(client):
    long = "word " * 2100
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": long}],
                                       max_tokens=10)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=SMOL, messages=MSG, max_tokens=5000)
    assert e.value.body["code"] == "context_length_exceeded"


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'"a string"', b"42"])
def test_malformed_or_non_object_json_is_400(smol_server, content):
    r = httpx.post(f"{smol_server.url}/v1/chat/completions", content=content,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_body_over_the_limit_is_413_before_it_is_read(smol_server):
    big = b'{"model": "x", "messages": [{"role": "user", "content": "' + b"a" * (2 << 20) + b'"}]}'
    r = httpx.post(f"{smol_server.url}/v1/chat/completions", content=big,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"

    def chunks():  # chunked upload: no Content-Length to judge by
        yield b'{"model": "x", "messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"a" * 65536
        yield b'"}]}'

    r = httpx.post(f"{smol_server.url}/v1/chat/completions", content=chunks(),
                   headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_abandoned_streams_free_their_sequences(smol_server):
    """vLLM's way: many streams abandoned after 0.5 s, then a fresh request must finish
    within 5 s (it would queue behind 16 x 2000-token generations if they were not freed)."""
    body = {"model": SMOL, "messages": MSG, "max_tokens": 1500, "temperature": 0, "stream": True,
            "ignore_eos": True}

    async def abandon():
        async with httpx.AsyncClient(timeout=30) as c:
            async with c.stream("POST", f"{smol_server.url}/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                await asyncio.sleep(0.5)

    async def run():
        await asyncio.gather(*(abandon() for _ in range(16)))

    asyncio.run(run())
    t0 = time.monotonic()
    r = httpx.post(f"{smol_server.url}/v1/chat/completions", timeout=30,
                   json={"model": SMOL, "messages": MSG, "max_tokens": 32, "temperature": 0})
    assert r.status_code == 200
    assert time.monotonic() - t0 < 5.0


def test_readyz_is_503_until_warm(server_factory):
    server = server_factory(smol_config(), wait=False)
    seen = set()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{server.url}/readyz", timeout=1)
        except httpx.HTTPError:
            time.sleep(0.02)
            continue
        seen.add(r.status_code)
        probes = [httpx.get(f"{server.url}/health", timeout=1),
                  httpx.post(f"{server.url}/ping", timeout=1)]  # vLLM's and llama.cpp's
        if all(p.status_code == 503 for p in probes):
            seen.add("probes503")
        elif r.status_code == 200 and all(p.json() == {"status": "ok"} for p in probes):
            seen.add("probes200")
        if r.status_code == 503:
            chat = httpx.post(f"{server.url}/v1/chat/completions", json={"model": SMOL, "messages": MSG})
            if chat.status_code == 503:
                assert chat.headers["retry-after"] and chat.json()["error"]["code"] == "not_ready"
                seen.add("chat503")
        if r.status_code == 200:
            break
        time.sleep(0.01)
    assert 200 in seen and 503 in seen and "chat503" in seen
    assert "probes503" in seen and "probes200" in seen
