"""Rerank and score (vLLM's /rerank, /v1/rerank, /v2/rerank, /score, /v1/score): the
bundled embedders (real models) through Cohere's official client and plain HTTP, and a
remote model passed through to its upstream."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import cohere
import gateway_support
import httpx
import numpy as np
import openai
import pytest

from redline.backends.fake_upstream import UpstreamSpec

QUERY = "What is the capital of China?"
DOCS = ["The capital of France is Paris.", "Beijing is the capital of China.",
        "Horses and cows are both animals."]
MODELS = ("all-minilm-l6-v2", "all-mpnet-base-v2")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with gateway_support.gateway(tmp_path_factory.mktemp("rerank"), UpstreamSpec(),
                                 upstream_model="served-reranker") as urls:
        yield urls


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=120)


def test_a_remote_model_is_passed_through(gateway: tuple[str, str]) -> None:
    url, up = gateway
    body = {"query": "capital beijing", "documents": DOCS, "top_n": 2,
            "rank_fields": ["text"]}  # a field only the upstream knows: passed on as it is
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        got = post(url, path, body | {"model": "remote"})
        want = post(up, path, body | {"model": "served-reranker"})
        assert got.status_code == 200, got.text
        assert got.json()["model"] == "remote"
        assert got.json()["results"] == want.json()["results"]
        assert [r["index"] for r in got.json()["results"]] == [1, 0]
        sent = httpx.get(f"{up}/last").json()
        assert sent == body | {"model": "served-reranker"}
    # the upstream's own 400 comes back as it is
    r = post(url, "/v1/rerank", {"model": "remote", "query": "x", "documents": []})
    assert r.status_code == 400 and "documents" in r.text


def test_bad_input_is_a_clear_400(gateway: tuple[str, str]) -> None:
    url, _ = gateway
    m = "all-minilm-l6-v2"
    for path, body, status, param in (
            ("/rerank", {"model": "nope", "query": "q", "documents": ["a"]}, 404, "model"),
            ("/rerank", {"model": m, "documents": ["a"]}, 400, "query"),
            ("/rerank", {"model": m, "query": "q", "documents": []}, 400, "documents"),
            ("/rerank", {"model": m, "query": "q", "documents": [{"title": "a"}]}, 400,
             "documents"),
            ("/rerank", {"model": m, "query": "q", "documents": ["a"], "top_n": -1}, 400, "top_n"),
            ("/v1/rerank", {"model": m, "query": "q", "documents": ["a"],
                            "rank_fields": ["text"]}, 400, "rank_fields"),
            ("/score", {"model": m, "text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, 400,
             "text_2"),
            ("/score", {"model": m, "text_1": [], "text_2": ["c"]}, 400, "text_1"),
            ("/v1/score", {"model": m, "text_1": "a"}, 400, "text_2")):
        r = post(url, path, body)
        assert r.status_code == status, (path, body, r.text)
        assert r.json()["error"]["param"] == param, (body, r.text)


def test_models_lists_the_bundled_encoders(gateway: tuple[str, str]) -> None:
    url, _ = gateway
    listed = {m["id"]: m["capabilities"] for m in httpx.get(f"{url}/v1/models").json()["data"]}
    for name in MODELS:
        assert listed[name] == ["embeddings", "rerank", "score"]


def _cosines(url: str, model: str, first: str, others: list[str]) -> np.ndarray:
    r = post(url, "/v1/embeddings", {"model": model, "input": [first, *others]})
    vecs = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
    return vecs[1:] @ vecs[0]  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_the_bundled_embedders_rerank_with_cohere_clients(gateway: tuple[str, str],
                                                          model: str) -> None:
    url, _ = gateway
    v2 = cohere.ClientV2(api_key="x", base_url=url)
    ranked = v2.rerank(model=model, query=QUERY, documents=DOCS)
    assert [r.index for r in ranked.results][0] == 1  # Beijing first
    scores = [r.relevance_score for r in ranked.results]
    assert scores == sorted(scores, reverse=True) and len(scores) == 3
    # a score is the cosine of the two texts' embeddings, as /v1/embeddings gives them
    cosines = _cosines(url, model, QUERY, DOCS)
    assert np.allclose([cosines[r.index] for r in ranked.results], scores, atol=1e-5)
    top = v2.rerank(model=model, query=QUERY, documents=DOCS, top_n=2)
    assert [r.index for r in top.results] == [r.index for r in ranked.results][:2]

    v1 = cohere.Client(api_key="x", base_url=url)
    old = v1.rerank(model=model, query=QUERY, documents=[{"text": d} for d in DOCS],
                    return_documents=True, top_n=1)
    assert old.results[0].index == 1 and old.results[0].document is not None
    assert old.results[0].document.text == DOCS[1]
    bare = post(url, "/v1/rerank", {"model": model, "query": QUERY, "documents": DOCS,
                                    "return_documents": False}).json()
    assert all("document" not in r for r in bare["results"])
    assert bare["usage"]["total_tokens"] > 3 * 5 and bare["id"].startswith("rerank-")


@pytest.mark.slow
def test_score_pairs_and_one_against_many(gateway: tuple[str, str]) -> None:
    url, _ = gateway
    model = "all-minilm-l6-v2"
    one = post(url, "/score", {"model": model, "text_1": QUERY, "text_2": DOCS}).json()
    assert one["object"] == "list" and one["model"] == model
    assert [d["index"] for d in one["data"]] == [0, 1, 2]
    assert np.allclose([d["score"] for d in one["data"]], _cosines(url, model, QUERY, DOCS),
                       atol=1e-5)
    pairs = post(url, "/v1/score", {"model": model, "text_1": [QUERY, "a cat on a mat"],
                                    "text_2": [DOCS[1], "a kitten sits on a rug"]}).json()
    first, second = (d["score"] for d in pairs["data"])
    assert np.isclose(first, one["data"][1]["score"], atol=1e-5)
    assert np.isclose(second, _cosines(url, model, "a cat on a mat",
                                       ["a kitten sits on a rug"])[0], atol=1e-5)
    assert pairs["usage"]["prompt_tokens"] == pairs["usage"]["total_tokens"] > 0
    default = post(url, "/score", {"text_1": QUERY, "text_2": DOCS}).json()  # no model: MiniLM
    assert default["model"] == model and default["data"] == one["data"]


@pytest.mark.slow
def test_long_texts_are_a_400_unless_cut(gateway: tuple[str, str]) -> None:
    url, _ = gateway
    model = "all-minilm-l6-v2"
    head = "beijing is the capital city"  # five word pieces, plus [CLS] and [SEP]
    long = head + " and more" * 300
    r = post(url, "/rerank", {"model": model, "query": QUERY, "documents": [long]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "documents[0]" in r.json()["error"]["message"]
    cut = post(url, "/rerank", {"model": model, "query": QUERY, "documents": [long, head],
                                "truncate_prompt_tokens": 7}).json()
    by_index = {r["index"]: r["relevance_score"] for r in cut["results"]}
    assert np.isclose(by_index[0], by_index[1], atol=1e-6)  # cut to exactly `head`
    assert post(url, "/rerank", {"model": model, "query": QUERY, "documents": [long],
                                 "truncate_prompt_tokens": -1}).status_code == 200
    r = post(url, "/rerank", {"model": model, "query": QUERY, "documents": [long],
                              "truncate_prompt_tokens": 9999})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"
    # Cohere's max_tokens_per_doc cuts the documents only
    v2 = cohere.ClientV2(api_key="x", base_url=url)
    ranked = v2.rerank(model=model, query=QUERY, documents=[long, head], max_tokens_per_doc=7)
    scores = {r.index: r.relevance_score for r in ranked.results}
    assert np.isclose(scores[0], scores[1], atol=1e-6)
    r = post(url, "/score", {"model": model, "text_1": long, "text_2": "x"})
    assert r.status_code == 400 and "text_1 has" in r.json()["error"]["message"]


def _batch(url: str, endpoint: str, bodies: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """custom_id -> the response of each line of a batch of `bodies` for `endpoint`, as
    the official client submits and reads it."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    lines = [{"custom_id": cid, "method": "POST", "url": endpoint, "body": b}
             for cid, b in bodies.items()]
    f = client.files.create(file=("in.jsonl", "\n".join(json.dumps(x) for x in lines).encode()),
                            purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint=endpoint,  # type: ignore[arg-type]
                                  completion_window="24h")
    deadline = time.monotonic() + 120
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed"):
        assert time.monotonic() < deadline, batch.status
        time.sleep(0.05)
    assert batch.status == "completed", batch
    out = []  # the answered lines and the failed ones (the error file's)
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id is not None:
            out += client.files.content(file_id).text.splitlines()
    client.close()
    return {line["custom_id"]: line["response"] or line["error"] for line in map(json.loads, out)}


def test_rerank_batch_lines_answer_what_the_route_answers(gateway: tuple[str, str]) -> None:
    """/v1/rerank and /v1/score as Batch API endpoints, as vLLM's batch runner has them:
    a remote model's line is the upstream's answer, named as redline names it."""
    url, _ = gateway
    bodies = {"a": {"model": "remote", "query": "capital beijing", "documents": DOCS},
              "b": {"model": "remote", "query": "horses", "documents": DOCS, "top_n": 1}}
    out = _batch(url, "/v1/rerank", bodies)
    for cid, body in bodies.items():
        want = post(url, "/v1/rerank", body).json()
        assert out[cid]["status_code"] == 200
        got = out[cid]["body"]
        assert got["model"] == "remote" and got["results"] == want["results"]
    # the upstream's 400 is the line's error, as the route passes it on
    bad = _batch(url, "/v1/rerank", {"x": {"model": "remote", "query": "q", "documents": []}})
    assert "documents is empty" in json.dumps(bad["x"])


@pytest.mark.slow
def test_score_batch_lines_on_the_bundled_embedder(gateway: tuple[str, str]) -> None:
    url, _ = gateway
    bodies = {"one": {"text_1": QUERY, "text_2": DOCS},
              "pairs": {"model": "all-minilm-l6-v2", "text_1": [QUERY], "text_2": [DOCS[1]]}}
    out = _batch(url, "/v1/score", bodies)
    for cid, body in bodies.items():
        want = post(url, "/v1/score", body).json()
        got = out[cid]["body"]
        assert out[cid]["status_code"] == 200 and got["model"] == "all-minilm-l6-v2"
        assert [d["score"] for d in got["data"]] == pytest.approx(
            [d["score"] for d in want["data"]], abs=1e-5)
