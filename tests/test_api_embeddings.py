"""POST /v1/embeddings with the official `openai` client: the bundled MiniLM (real model,
float and base64, lists, limits) and a remote model passed through to its upstream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gateway_support
import httpx
import numpy as np
import openai
import pytest

from redline.backends.fake_upstream import UpstreamSpec


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[openai.OpenAI, str, str]]:
    # the semantic cache on: its MiniLM (BF16 where the CPU has it) is not the API's
    with gateway_support.gateway(tmp_path_factory.mktemp("embeddings"), UpstreamSpec(),
                                 upstream_model="served-embed",
                                 cache={"enabled": True}) as (gw, up):
        client = openai.OpenAI(base_url=f"{gw}/v1", api_key="x", max_retries=0)
        yield client, gw, up
        client.close()


def test_a_remote_model_is_passed_through(gateway: Any) -> None:
    client, _, up = gateway
    direct = openai.OpenAI(base_url=f"{up}/v1", api_key="x", max_retries=0)
    for kwargs in ({"input": "hello world"}, {"input": ["a b", "c"], "dimensions": 4},
                   {"input": [[1, 2, 3], [4]]}, {"input": "x", "encoding_format": "float"}):
        got = client.embeddings.create(model="remote", **kwargs)  # type: ignore[arg-type]
        want = direct.embeddings.create(model="served-embed", **kwargs)  # type: ignore[arg-type]
        assert got.model == "remote"
        assert [d.embedding for d in got.data] == [d.embedding for d in want.data]
        assert got.usage == want.usage
    sent = httpx.get(f"{up}/last").json()
    assert sent["model"] == "served-embed" and sent["encoding_format"] == "float"
    client.embeddings.create(model="remote", input="x", extra_body={"truncate_prompt_tokens": 9})
    assert httpx.get(f"{up}/last").json()["truncate_prompt_tokens"] == 9  # the engine's to do
    direct.close()


def test_bad_input_is_a_400_with_param(gateway: Any) -> None:
    _, url, _ = gateway
    for body, status, param in (
            ({"model": "nope", "input": "x"}, 404, "model"),
            ({"model": "all-minilm-l6-v2", "input": []}, 400, "input"),
            ({"model": "all-minilm-l6-v2", "input": ["ok", ""]}, 400, "input"),
            ({"model": "all-minilm-l6-v2", "input": [[1, 2]]}, 400, "input"),
            ({"model": "all-minilm-l6-v2", "input": ["x"] * 2049}, 400, "input"),
            ({"model": "all-minilm-l6-v2", "input": "x", "encoding_format": "int8"}, 400,
             "encoding_format"),
            ({"model": "all-minilm-l6-v2", "input": "x", "truncate": "END"}, 400, "truncate")):
        r = httpx.post(f"{url}/v1/embeddings", json=body, timeout=60)
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"]["param"] == param


@pytest.mark.slow
def test_the_bundled_minilm(gateway: Any) -> None:
    client, url, _ = gateway
    texts = ["The cat sits on the mat.", "A cat is sitting on a mat.", "Stock markets fell."]
    floats = client.embeddings.create(model="all-minilm-l6-v2", input=texts,
                                      encoding_format="float")
    b64 = client.embeddings.create(model="all-minilm-l6-v2", input=texts)  # the client: base64
    assert floats.model == "all-minilm-l6-v2" and len(floats.data) == 3
    vecs = np.array([d.embedding for d in floats.data], dtype=np.float32)
    assert vecs.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    assert np.allclose(vecs, np.array([d.embedding for d in b64.data]), atol=1e-6)
    sims = vecs @ vecs.T
    assert sims[0, 1] > 0.8 > sims[0, 2]  # paraphrases close, other topics apart
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 3 * 3
    one = client.embeddings.create(model="all-minilm-l6-v2", input=texts[0],
                                   encoding_format="float")
    assert np.allclose(one.data[0].embedding, vecs[0], atol=1e-5)
    # float32, as sentence-transformers answers: not the cache's copy where that runs in BF16
    from redline.cache.embedder import load_minilm

    assert np.allclose(one.data[0].embedding, load_minilm(None, 1).encode([texts[0]])[0], atol=1e-5)
    r = httpx.post(f"{url}/v1/embeddings", timeout=60,
                   json={"model": "all-minilm-l6-v2", "input": "word " * 400})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(f"{url}/v1/embeddings", timeout=60,
                   json={"model": "all-minilm-l6-v2", "input": "x", "dimensions": 12})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
    # vLLM's truncate_prompt_tokens: a cut instead of the 400, exact (the first 7 word
    # pieces embed as the text that is those pieces)
    head = "the cat sits on the"  # five word pieces, plus [CLS] and [SEP]
    cut = client.embeddings.create(model="all-minilm-l6-v2", encoding_format="float",
                                   input=[head + " mat" * 400, head],
                                   extra_body={"truncate_prompt_tokens": 7})
    assert np.allclose(cut.data[0].embedding, cut.data[1].embedding, atol=1e-6)
    assert cut.usage.prompt_tokens == 14
    whole = client.embeddings.create(model="all-minilm-l6-v2", encoding_format="float",
                                     input="word " * 400, extra_body={"truncate_prompt_tokens": -1})
    assert whole.usage.prompt_tokens == 256
    r = httpx.post(f"{url}/v1/embeddings", timeout=60, json={
        "model": "all-minilm-l6-v2", "input": "x", "truncate_prompt_tokens": 300})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"


@pytest.mark.slow
def test_the_bundled_mpnet(gateway: Any) -> None:
    client, url, _ = gateway
    texts = ["The cat sits on the mat.", "A cat is sitting on a mat.", "Stock markets fell."]
    got = client.embeddings.create(model="all-mpnet-base-v2", input=texts, encoding_format="float")
    assert got.model == "all-mpnet-base-v2"
    vecs = np.array([d.embedding for d in got.data], dtype=np.float32)
    assert vecs.shape == (3, 768) and np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    sims = vecs @ vecs.T
    assert sims[0, 1] > 0.8 > sims[0, 2]
    r = httpx.post(f"{url}/v1/embeddings", timeout=60,  # its context is 384 word pieces
                   json={"model": "all-mpnet-base-v2", "input": "word " * 300})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{url}/v1/embeddings", timeout=60,
                   json={"model": "all-mpnet-base-v2", "input": "word " * 400})
    assert r.status_code == 400 and "384 tokens" in r.json()["error"]["message"]
