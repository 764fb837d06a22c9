"""Embeddings, for POST /v1/embeddings (embeddings_routes.py) and a batch's lines
(job_body.py): the bundled all-MiniLM-L6-v2 (the semantic cache's embedder, one
copy per process) as model `all-minilm-l6-v2`, and any remote OpenAI-compatible model
passed through to its upstream (body and answer as they are, the model name mapped).

Bounds as OpenAI's: at most 2048 inputs, none empty, each within the model's context
(MiniLM: 256 word pieces, a 400 past it rather than a silent truncation); token arrays
only for remote models (MiniLM's ids are not OpenAI's); `encoding_format` float or
base64 (little-endian float32, as OpenAI's and its client's)."""

from __future__ import annotations

import asyncio
import base64
import time
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field

from redline.api import upstream
from redline.cache import ResponseCache
from redline.cache.embedder import MiniLMEmbedder, bundled_minilm_path, load_minilm
from redline.config import RedlineConfig
from redline.errors import BackendError, InvalidRequest, ModelNotFound, RedlineError
from redline.pipeline import Pipeline
from redline.types import Finished, GenerationRequest, SamplingParams, Tier, Usage

LOCAL_MODEL = "all-minilm-l6-v2"
MAX_INPUTS = 2048


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # passed to a remote upstream as it came

    model: str = Field(..., min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


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
        raise InvalidRequest(f"The model `{LOCAL_MODEL}` takes text, not token arrays.",
                             param="input")
    texts = [str(t) for t in raw]
    if any(not t for t in texts):
        raise InvalidRequest("'input' must not hold empty strings.", param="input")
    return texts


def _encode(vector: np.ndarray, fmt: str) -> Any:
    if fmt == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return [float(x) for x in vector]


async def _embedder(config: RedlineConfig, cache: ResponseCache | None) -> MiniLMEmbedder:
    """The semantic cache's copy when it has loaded one, else the same one loaded now
    (load_minilm keeps one per directory and thread setting)."""
    if cache is not None and isinstance(cache.embedder, MiniLMEmbedder):
        return cache.embedder
    threads = cache.embedder_threads if cache is not None else 1
    return await asyncio.to_thread(load_minilm, config.cache.embedder_path, threads)


async def _local(config: RedlineConfig, cache: ResponseCache | None,
                 body: EmbeddingRequest) -> tuple[int, bytes, int]:
    """The answer (status, body), and the tokens it embedded."""
    unknown = next(iter(body.model_extra or {}), None)  # kept for a remote upstream only
    if unknown is not None:
        raise InvalidRequest(f"The model `{LOCAL_MODEL}` does not serve '{unknown}'.",
                             param=unknown)
    texts = _texts(body)
    embedder = await _embedder(config, cache)
    if body.dimensions is not None and body.dimensions != embedder.dim:
        raise InvalidRequest(f"The model `{LOCAL_MODEL}` has {embedder.dim} dimensions.",
                             param="dimensions")
    counts = await asyncio.to_thread(embedder.token_counts, texts)
    limit = embedder.max_tokens
    for i, n in enumerate(counts):
        if n > limit:
            raise InvalidRequest(f"This model's maximum context length is {limit} tokens, "
                                 f"however input[{i}] has {n} tokens.", param="input",
                                 code="context_length_exceeded")
    vectors = await asyncio.to_thread(embedder.encode, texts)
    total = sum(counts)
    payload = {"object": "list",
               "data": [{"object": "embedding", "index": i,
                         "embedding": _encode(v, body.encoding_format)}
                        for i, v in enumerate(vectors)],
               "model": LOCAL_MODEL, "usage": {"prompt_tokens": total, "total_tokens": total}}
    return 200, orjson.dumps(payload), total


async def _remote(config: RedlineConfig, body: EmbeddingRequest,
                  name: str) -> tuple[int, bytes, int]:
    """The upstream's answer (status, body), and the tokens its usage counts (0 for an
    error)."""
    model = next(m for m in config.models if m.name == name)
    r = await upstream.post(model, "/v1/embeddings", body.model_dump(exclude_none=True))
    if r.status_code >= 500 or r.status_code in (401, 403, 404):  # ours to fix, not the user's
        raise BackendError(f"{name}: upstream answered {r.status_code}")
    if r.status_code >= 400:
        return r.status_code, r.content, 0
    payload = r.json()
    if isinstance(payload, dict) and "model" in payload:
        payload["model"] = name
    return 200, orjson.dumps(payload), _usage_tokens(payload)


def check_model(config: RedlineConfig, name: str) -> None:
    """ModelNotFound unless `name` serves embeddings here (the local one, or a remote)."""
    if name != LOCAL_MODEL and not any(m.name == name and m.backend == "openai"
                                       for m in config.models):
        raise ModelNotFound(f"The model `{name}` does not exist or serves no embeddings "
                            f"(embedding models: {LOCAL_MODEL} and the remote ones).",
                            param="model")


async def embed(config: RedlineConfig, cache: ResponseCache | None,
                body: EmbeddingRequest) -> tuple[int, bytes, int]:
    """The answer to an embeddings request (status, body) and the tokens it used: what
    the route answers, and a batch line too (api/job_body.py)."""
    check_model(config, body.model)
    if body.model == LOCAL_MODEL:
        return await _local(config, cache, body)
    return await _remote(config, body, body.model)


def as_request(body: EmbeddingRequest, tenant: str, tier: Tier) -> GenerationRequest:
    """What a tenant's rate limits, a key's budget and the pipeline's observers see of
    an embeddings request: a request of its model whose prompt is its input (their
    estimate of its tokens), with nothing to generate."""
    text = " ".join(str(x) for x in ([body.input] if isinstance(body.input, str) else body.input))
    return GenerationRequest(model=body.model, prompt=text, sampling=SamplingParams(max_tokens=1),
                             tier=tier, tenant=tenant, use_cache=False, user=body.user)


async def embed_told(config: RedlineConfig, pipeline: Pipeline, body: EmbeddingRequest,
                     line: GenerationRequest) -> tuple[int, bytes]:
    """`embed`, its end told to the pipeline's observers as a completion's end is (the
    gate settles `line`'s reservation and slot, its key's budget is charged, its usage
    counted): a live request's and a batch line's answer (status, body)."""
    t0 = time.perf_counter()
    status, tokens = "500", 0
    try:
        code, content, tokens = await embed(config, pipeline.cache, body)
        status = str(code)
        return code, content
    except RedlineError as exc:
        status = str(exc.status)
        raise
    finally:
        total = time.perf_counter() - t0
        pipeline.tell(Finished(line, body.model, line.tier or "A", "bypass", status, "stop", 0, None,
                               total, Usage(tokens, 0), "", MappingProxyType({"total": total})))


def local_available(embedder_path: str | None) -> bool:
    """Whether the local embedder can load: a configured directory, or the bundled package
    installed (/v1/models lists it then)."""
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
