"""Rerank and score, as vLLM's server has them (`/rerank`, `/v1/rerank`, `/v2/rerank`;
`/score`, `/v1/score`), for retrieval pipelines that reorder what a search found before
the model reads it.

The bundled embedders (embeddings.py: `all-minilm-l6-v2`, `all-mpnet-base-v2`) score a
pair as vLLM scores one with an embedding model: the cosine of the two texts' sentence
embeddings (a bi-encoder, not a cross-encoder: no cross-encoder installs here without a
model hub). A remote model's body goes to its engine at the path the client called (a
vLLM or llama.cpp reranker), the model name mapped, and its answer comes back as it is.

Rerank takes Jina's and Cohere's fields as vLLM does: `query`, `documents` (strings, or
objects with a `text`), `top_n` (0 or absent: all), `return_documents` (default true:
each result carries its document, as vLLM's do), and answers `{"id", "model", "usage":
{"total_tokens"}, "results": [{"index", "document": {"text"}, "relevance_score"}]}`,
best first. Cohere's clients read that answer at /v1/rerank and /v2/rerank.

Score takes vLLM's `text_1` and `text_2`: one text against each of a list, or two lists
pair by pair; it answers `{"id", "object": "list", "created", "model", "data": [{"index",
"object": "score", "score"}], "usage"}`.

A text longer than the model's context is a 400 (as vLLM's), unless the request asks for
a cut: vLLM's `truncate_prompt_tokens` (every text; -1: the model's context) or Cohere's
`max_tokens_per_doc` (the documents, at most the model's context). A field a bundled
model does not serve is a 400 naming it."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field

from redline.api.embeddings import (
    LOCAL_MODEL,
    LOCAL_MODELS,
    MAX_INPUTS,
    check_model,
    counted,
    cut_of,
    local_embedder,
    local_models,
    refuse_unknown,
    remote_answer,
)
from redline.cache import ResponseCache
from redline.cache.embedder import SentenceEmbedder
from redline.config import RedlineConfig
from redline.errors import InvalidRequest


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # passed to a remote upstream as it came

    model: str | None = Field(None, min_length=1)
    query: str
    documents: list[str | dict[str, Any]]  # Jina's and Cohere's objects: {"text": ...}
    top_n: int | None = Field(None, ge=0)
    return_documents: bool = True
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    max_tokens_per_doc: int | None = Field(None, ge=1)
    user: str | None = None

    def all_texts(self) -> list[str]:
        """The query and the documents as the gate counts them (before any check)."""
        return [self.query, *(d if isinstance(d, str) else str(d.get("text", ""))
                              for d in self.documents)]

    def texts(self) -> list[str]:
        """The documents' texts (a bundled model's reading: an object is its `text`)."""
        out = []
        for i, doc in enumerate(self.documents):
            if isinstance(doc, dict):
                text = doc.get("text")
                if not isinstance(text, str) or len(doc) != 1:
                    raise InvalidRequest(f"documents[{i}] must be a string or an object with "
                                         "one field, `text`, a string.", param="documents")
                doc = text
            out.append(doc)
        return out


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = Field(None, min_length=1)
    text_1: str | list[str]
    text_2: str | list[str]
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    user: str | None = None

    def all_texts(self) -> list[str]:
        """Both sides' texts as the gate counts them."""
        return [*_listed(self.text_1), *_listed(self.text_2)]

    def pairs(self) -> tuple[list[str], list[str]]:
        """(firsts, seconds): one first text, scored against every second one, or as many
        firsts as seconds, pair by pair."""
        firsts, seconds = _listed(self.text_1), _listed(self.text_2)
        if not firsts or not seconds:
            raise InvalidRequest("text_1 and text_2 must not be empty.",
                                 param="text_1" if not firsts else "text_2")
        if len(firsts) not in (1, len(seconds)):
            raise InvalidRequest(f"text_1 holds {len(firsts)} texts and text_2 {len(seconds)}: "
                                 "give one text_1, or as many as text_2.", param="text_2")
        return firsts, seconds


def _listed(texts: str | list[str]) -> list[str]:
    return [texts] if isinstance(texts, str) else list(texts)


def model_of(config: RedlineConfig, asked: str | None) -> str:
    """The model that answers: the one named (a bundled embedder, or a remote model),
    else the first bundled one (vLLM's server answers with the model it serves)."""
    if asked is None:
        bundled = local_models(config)
        if not bundled:
            raise InvalidRequest("Name a model: no bundled embedder is installed here.",
                                 param="model")
        return bundled[0]
    check_model(config, asked, "scores no texts")
    return asked


async def _embedded(embedder: SentenceEmbedder, texts: list[str], param: str,
                    cut: int | None, single: bool = False) -> tuple[np.ndarray, int]:
    """The texts' unit vectors and their word pieces (after the cut)."""
    counts = await counted(embedder, texts, param, cut, single)
    vectors = await asyncio.to_thread(embedder.encode, texts, cut)
    return vectors, sum(counts)


async def rerank(config: RedlineConfig, cache: ResponseCache | None, path: str,
                 body: RerankRequest, name: str) -> tuple[int, bytes, int]:
    """The answer of model `name` (model_of's) to `body`, sent to `path`: (status, body)
    and the tokens it used."""
    if name not in LOCAL_MODELS:
        return await remote_answer(config, name, path, body.model_dump(exclude_unset=True))
    refuse_unknown(name, body.model_extra)
    docs = body.texts()
    if not docs:
        raise InvalidRequest("'documents' must not be empty.", param="documents")
    if len(docs) > MAX_INPUTS:
        raise InvalidRequest(f"'documents' holds {len(docs)} items; at most {MAX_INPUTS}.",
                             param="documents")
    embedder = await local_embedder(config, cache, name)
    cut = cut_of(embedder, body.truncate_prompt_tokens)
    doc_cut = cut
    if body.max_tokens_per_doc is not None:
        doc_cut = min(body.max_tokens_per_doc, embedder.max_tokens, cut or embedder.max_tokens)
    query, q_tokens = await _embedded(embedder, [body.query], "query", cut, single=True)
    vectors, d_tokens = await _embedded(embedder, docs, "documents", doc_cut)
    scores = vectors @ query[0]
    order = sorted(range(len(docs)), key=lambda i: -float(scores[i]))  # stable: ties by index
    if body.top_n:
        order = order[:body.top_n]
    results = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if body.return_documents:
            result["document"] = {"text": docs[i]}
        results.append(result)
    total = q_tokens + d_tokens
    payload = {"id": f"rerank-{uuid.uuid4().hex}", "model": name,
               "usage": {"total_tokens": total}, "results": results}
    return 200, orjson.dumps(payload), total


async def score(config: RedlineConfig, cache: ResponseCache | None, path: str,
                body: ScoreRequest, name: str) -> tuple[int, bytes, int]:
    """As rerank, for a score request."""
    if name not in LOCAL_MODELS:
        return await remote_answer(config, name, path, body.model_dump(exclude_unset=True))
    refuse_unknown(name, body.model_extra)
    firsts, seconds = body.pairs()
    if len(seconds) > MAX_INPUTS:
        raise InvalidRequest(f"text_2 holds {len(seconds)} texts; at most {MAX_INPUTS}.",
                             param="text_2")
    embedder = await local_embedder(config, cache, name)
    cut = cut_of(embedder, body.truncate_prompt_tokens)
    left, l_tokens = await _embedded(embedder, firsts, "text_1", cut,
                                     single=isinstance(body.text_1, str))
    right, r_tokens = await _embedded(embedder, seconds, "text_2", cut,
                                      single=isinstance(body.text_2, str))
    scores = right @ left[0] if len(firsts) == 1 else np.einsum("ij,ij->i", left, right)
    total = l_tokens + r_tokens
    payload = {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
               "model": name,
               "data": [{"index": i, "object": "score", "score": float(s)}
                        for i, s in enumerate(scores)],
               "usage": {"prompt_tokens": total, "total_tokens": total, "completion_tokens": 0}}
    return 200, orjson.dumps(payload), total


__all__ = ["LOCAL_MODEL", "RerankRequest", "ScoreRequest", "model_of", "rerank", "score"]
