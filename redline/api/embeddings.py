"""Embeddings, for POST /v1/embeddings (embeddings_routes.py), a batch's lines
(job_body.py) and the rerank and score routes (rerank.py): two bundled sentence
embedders, and any remote OpenAI-compatible model passed through to its upstream (body
and answer as they are, the model name mapped).

The bundled ones (`LOCAL_MODELS`, each listed where it is installed):
- `all-minilm-l6-v2`: the semantic cache's embedder (384 dims, 256 word pieces);
- `all-mpnet-base-v2`: the cache's borderline check's (768 dims, 384 word pieces; ~5x
  MiniLM's time, better rankings).
One copy of each per process, shared with the cache that loaded it.

Bounds as OpenAI's: at most 2048 inputs, none empty, each within the model's context (a
400 past it rather than a silent truncation, unless vLLM's `truncate_prompt_tokens` asks
for a cut: -1 at the model's context, or at that many word pieces); token arrays only for remote models (a
bundled model's ids are not OpenAI's); `encoding_format` float or base64 (little-endian
float32, as OpenAI's and its client's)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field

from redline.api import upstream
from redline.cache import ResponseCache
from redline.cache.bundled import MPNET, mpnet_available, mpnet_path
from redline.cache.embedder import (
    SentenceEmbedder,
    bundled_minilm_path,
    load_minilm,
    load_sentence_model,
)
from redline.config import RedlineConfig
from redline.errors import BackendError, InvalidRequest, ModelNotFound, RedlineError
from redline.pipeline import Pipeline
from redline.types import Finished, GenerationRequest, SamplingParams, Tier, Usage

LOCAL_MODEL = "all-minilm-l6-v2"  # the semantic cache's
LOCAL_MODELS = (LOCAL_MODEL, MPNET)
MAX_INPUTS = 2048


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # passed to a remote upstream as it came

    model: str = Field(..., min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1)  # vLLM's: cut, not a 400 (cut_of)


def _texts(body: EmbeddingRequest) -> list[str]:
    raw = body.input
    if isinstance(raw, str):
        raw = [raw]
    if not raw:
        raise InvalidRequest("'input' must not be empty.", param="input")
    if len(raw) > MAX_INPUTS:
        raise InvalidRequest(f"'input' holds {len(raw)} items; at most {MAX_INPUTS}.",
                             param="input")
    if not all(isinstance(t, str) for t in raw):
        raise InvalidRequest(f"The model `{body.model}` takes text, not token arrays.",
                             param="input")
    texts = [str(t) for t in raw]
    if any(not t for t in texts):
        raise InvalidRequest("'input' must not hold empty strings.", param="input")
    return texts


def _encode(vector: np.ndarray, fmt: str) -> Any:
    if fmt == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return [float(x) for x in vector]


async def local_embedder(config: RedlineConfig, cache: ResponseCache | None,
                         name: str) -> SentenceEmbedder:
    """The bundled model `name`, run by sentence-transformers in float32 (one per directory,
    thread setting and process): not the semantic cache's copy, whose traced graph (and
    BF16, where the CPU has it) answers within ~1e-2 of it, not what a client of an
    embeddings API expects."""
    threads = cache.embedder_threads if cache is not None else 1
    if name == MPNET:
        path = config.cache.confirm_path or str(await asyncio.to_thread(mpnet_path))
        return await asyncio.to_thread(load_sentence_model, path, threads)
    return await asyncio.to_thread(load_minilm, config.cache.embedder_path, threads)


def refuse_unknown(model: str, fields: dict[str, Any] | None) -> None:
    """A 400 naming the first field a bundled model does not serve (kept in the body for
    a remote upstream only)."""
    unknown = next(iter(fields or {}), None)
    if unknown is not None:
        raise InvalidRequest(f"The model `{model}` does not serve '{unknown}'.", param=unknown)


async def counted(embedder: SentenceEmbedder, texts: list[str], param: str,
                  cut: int | None = None, single: bool = False) -> list[int]:
    """Each text's word pieces, after a cut at `cut` where given; without one, a 400
    (context_length_exceeded, `param`) for the first beyond the model's context, named
    `param[i]` (`param` for a `single` text)."""
    counts = await asyncio.to_thread(embedder.token_counts, texts)
    if cut is not None:
        return [min(n, cut) for n in counts]
    limit = embedder.max_tokens
    for i, n in enumerate(counts):
        if n > limit:
            name = param if single else f"{param}[{i}]"
            raise InvalidRequest(f"This model's maximum context length is {limit} tokens, "
                                 f"however {name} has {n} tokens.", param=param,
                                 code="context_length_exceeded")
    return counts


def cut_of(embedder: SentenceEmbedder, asked: int | None) -> int | None:
    """vLLM's truncate_prompt_tokens as a cut in word pieces (None: no cut)."""
    if asked is None:
        return None
    limit = embedder.max_tokens
    if asked == -1:
        return limit
    if asked == 0 or asked > limit:
        raise InvalidRequest(f"truncate_prompt_tokens is {asked}; it must be -1 (the model's "
                             f"context) or from 1 to {limit}.", param="truncate_prompt_tokens")
    return asked


async def _local(config: RedlineConfig, cache: ResponseCache | None,
                 body: EmbeddingRequest) -> tuple[int, bytes, int]:
    """The answer (status, body), and the tokens it embedded."""
    refuse_unknown(body.model, body.model_extra)
    texts = _texts(body)
    embedder = await local_embedder(config, cache, body.model)
    if body.dimensions is not None and body.dimensions != embedder.dim:
        raise InvalidRequest(f"The model `{body.model}` has {embedder.dim} dimensions.",
                             param="dimensions")
    cut = cut_of(embedder, body.truncate_prompt_tokens)
    counts = await counted(embedder, texts, "input", cut)
    vectors = await asyncio.to_thread(embedder.encode, texts, cut)
    total = sum(counts)
    payload = {"object": "list",
               "data": [{"object": "embedding", "index": i,
                         "embedding": _encode(v, body.encoding_format)}
                        for i, v in enumerate(vectors)],
               "model": body.model, "usage": {"prompt_tokens": total, "total_tokens": total}}
    return 200, orjson.dumps(payload), total


async def remote_answer(config: RedlineConfig, name: str, path: str,
                        body: dict[str, Any]) -> tuple[int, bytes, int]:
    """The answer of the remote model `name`'s engine at `path` to `body` (status, body,
    its model named as here), and the tokens its usage counts (0 for an error)."""
    model = next(m for m in config.models if m.name == name)
    r = await upstream.post(model, path, body)
    if r.status_code >= 500 or r.status_code in (401, 403, 404):  # ours to fix, not the user's
        raise BackendError(f"{name}: upstream answered {r.status_code}")
    if r.status_code >= 400:
        return r.status_code, r.content, 0
    payload = r.json()
    if isinstance(payload, dict) and "model" in payload:
        payload["model"] = name
    return 200, orjson.dumps(payload), _usage_tokens(payload)


def local_models(config: RedlineConfig) -> list[str]:
    """The bundled embedders that can load here (what /v1/models lists): a configured
    directory, or the bundled package installed."""
    names = [LOCAL_MODEL] if local_available(config.cache.embedder_path) else []
    if config.cache.confirm_path or mpnet_available():
        names.append(MPNET)
    return names


def remote_model(config: RedlineConfig, name: str) -> bool:
    return any(m.name == name and m.backend == "openai" for m in config.models)


def check_model(config: RedlineConfig, name: str, lacks: str = "serves no embeddings") -> None:
    """ModelNotFound unless `name` is an encoder here (a bundled one, or a remote): for
    embeddings, and for rerank and score (rerank.py), which say what it `lacks`."""
    bundled = local_models(config)
    if name not in bundled and not remote_model(config, name):
        listed = ", ".join(bundled) or "none installed"
        raise ModelNotFound(f"The model `{name}` does not exist or {lacks} "
                            f"(bundled embedding models: {listed}; and the remote models).",
                            param="model")


async def embed(config: RedlineConfig, cache: ResponseCache | None,
                body: EmbeddingRequest) -> tuple[int, bytes, int]:
    """The answer to an embeddings request (status, body) and the tokens it used: what
    the route answers, and a batch line too (api/job_body.py)."""
    check_model(config, body.model)
    if body.model in LOCAL_MODELS:
        return await _local(config, cache, body)
    return await remote_answer(config, body.model, "/v1/embeddings",
                               body.model_dump(exclude_none=True))


def as_request(body: EmbeddingRequest, tenant: str, tier: Tier) -> GenerationRequest:
    """What a tenant's rate limits, a key's budget and the pipeline's observers see of
    an embeddings request: a request of its model whose prompt is its input (their
    estimate of its tokens), with nothing to generate."""
    raw = [body.input] if isinstance(body.input, str) else body.input
    return encoder_request(body.model, [str(x) for x in raw], tenant, tier, body.user)


def encoder_request(model: str, texts: list[str], tenant: str, tier: Tier,
                    user: str | None = None) -> GenerationRequest:
    """A request of an encoder (embeddings, rerank, score) as the gate and the observers
    see it: its texts as the prompt, nothing to generate."""
    return GenerationRequest(model=model, prompt=" ".join(texts),
                             sampling=SamplingParams(max_tokens=1), tier=tier, tenant=tenant,
                             use_cache=False, user=user)


async def told(pipeline: Pipeline, line: GenerationRequest,
               answer: Awaitable[tuple[int, bytes, int]]) -> tuple[int, bytes]:
    """An encoder's `answer` (status, body, tokens), its end told to the pipeline's
    observers as a completion's end is (the gate settles `line`'s reservation and slot,
    its key's budget is charged, its usage counted)."""
    t0 = time.perf_counter()
    status, tokens = "500", 0
    try:
        code, content, tokens = await answer
        status = str(code)
        return code, content
    except RedlineError as exc:
        status = str(exc.status)
        raise
    finally:
        total = time.perf_counter() - t0
        pipeline.tell(Finished(line, line.model, line.tier or "A", "bypass", status, "stop", 0, None,
                               total, Usage(tokens, 0), "", MappingProxyType({"total": total})))


async def embed_told(config: RedlineConfig, pipeline: Pipeline, body: EmbeddingRequest,
                     line: GenerationRequest) -> tuple[int, bytes]:
    """`embed`, told: a live request's and a batch line's answer (status, body)."""
    return await told(pipeline, line, embed(config, pipeline.cache, body))


def local_available(embedder_path: str | None) -> bool:
    """Whether MiniLM can load: a configured directory, or the bundled package
    installed."""
    if embedder_path:
        return True
    try:
        bundled_minilm_path()
    except FileNotFoundError:
        return False
    return True


def _usage_tokens(payload: Any) -> int:
    """The tokens an upstream's answer says it used (0 where it says nothing usable)."""
    try:
        usage = payload.get("usage") or {}
        return int(usage.get("total_tokens") or usage.get("prompt_tokens") or 0)
    except (AttributeError, TypeError, ValueError):
        return 0
