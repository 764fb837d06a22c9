"""Runs one request the way a live request runs: `Pipeline.complete`, then the chunks
to the end (cache, routing and engine all apply). The answer is shaped, and a request
kept as its body (tools, response_format, logprobs, n, ...: jobs/spec.py) is read, by the
api's `Shapes` (api/job_body.py): the body the endpoint itself gives."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Protocol

from redline.cache import CachedAnswer
from redline.errors import BackendError
from redline.jobs.spec import WHOLE, JobSpec
from redline.pipeline import Pipeline
from redline.types import Chunk, GenerationRequest, Usage


class Gate(Protocol):
    """The tenant's limits, for requests that run as jobs: `enter` returns once the
    request may run (it counts against them), waiting while they are spent; `key`, the
    API key the job was made with, is charged for it (its budget, its usage)."""

    async def enter(self, tenant: str, request: GenerationRequest,
                    key: str | None = None) -> None: ...


class Shapes(Protocol):
    """The api's reading of a request kept as its body, and of its answer."""

    def request(self, spec: JobSpec) -> GenerationRequest:
        """The request `spec.body` makes (raises InvalidRequest as the endpoint would)."""
        ...

    def body(self, spec: JobSpec, request: GenerationRequest, model: str,
             chunks: list[Chunk], usage: Usage | None,
             finish_reason: str | None) -> dict[str, Any]:
        """The endpoint's whole (non-streamed) answer made of `chunks`."""
        ...

    async def whole(self, spec: JobSpec, gate: Gate | None) -> dict[str, Any]:
        """The answer to a batch line the api runs itself (an embeddings line, a
        response), held to its tenant's limits and key as a completion is (`gate`)."""
        ...


async def run_request(pipeline: Pipeline, spec: JobSpec, shapes: Shapes,
                      gate: Gate | None = None) -> dict[str, Any]:
    """The OpenAI response body for `spec`; raises RedlineError when it fails."""
    if spec.endpoint in WHOLE:  # not a plain generation: the api runs it whole
        return await shapes.whole(spec, gate)
    request = spec.request() if spec.body is None else shapes.request(spec)
    if gate is not None:  # a background job or a batch line counts as its tenant's request
        await gate.enter(spec.tenant, request, spec.key)
    completion = await pipeline.complete(request)
    chunks: list[Chunk] = []
    async for chunk in completion.chunks:
        if chunk.finish_reason == "error":
            raise BackendError(chunk.error or "generation failed")
        chunks.append(chunk)
    if spec.refresh_cache:
        await _refresh(pipeline, spec, completion.model, "".join(c.text for c in chunks),
                       completion.finish_reason, completion.usage)
    return shapes.body(spec, request, completion.model, chunks, completion.usage,
                       completion.finish_reason)


async def _refresh(pipeline: Pipeline, spec: JobSpec, model: str, text: str,
                   finish_reason: str | None, usage: Usage | None) -> None:
    """Put a precomputed answer in the response cache under the key a user's identical
    question looks up (the run itself bypassed the lookup, so the pipeline stored nothing)."""
    cache = pipeline.cache
    if cache is None or finish_reason not in ("stop", "length"):
        return
    asked = dataclasses.replace(spec, use_cache=True, refresh_cache=False).request()
    if not cache.cacheable(asked):
        return
    u = usage or Usage(0, 0)
    await cache.put(asked, CachedAnswer(model, text, finish_reason, u.prompt_tokens,
                                        u.completion_tokens, None, time.time()))
