"""A request body as a job: what a batch line or a queued request runs. The jobs
service (jobs/service.py) is handed `decode_body` and `JobShapes` by the factory
(api/services.py), so it checks a body, and answers one that is more than plain text,
exactly as the live endpoint does without importing the api."""

from __future__ import annotations

from typing import Any

import orjson

from redline.api import capabilities
from redline.api.chunks import ChunkEncoder
from redline.api.embeddings import EmbeddingRequest, as_request, check_model, embed_told
from redline.api.errors import validated
from redline.api.schemas import ChatCompletionRequest, CompletionRequest
from redline.api.unicode import check_text
from redline.config import RedlineConfig
from redline.errors import InvalidRequest
from redline.jobs.runner import Gate
from redline.jobs.spec import ENDPOINTS, Endpoint, JobSpec
from redline.pipeline import Pipeline
from redline.types import Chunk, GenerationRequest, Usage, assemble


def _parsed(endpoint: Endpoint, body: dict[str, Any]) -> ChatCompletionRequest | CompletionRequest:
    check_text(body)
    if endpoint == "chat":
        return validated(ChatCompletionRequest, body)
    return validated(CompletionRequest, body)


def decode_body(url: str, body: dict[str, Any]) -> JobSpec:
    """A request body of `url` (a batch line, a scheduled job) as a job spec; bad bodies
    raise InvalidRequest just as the live endpoint would answer them."""
    endpoint = ENDPOINTS.get(url)
    if endpoint is None:
        raise InvalidRequest(f"Unsupported url {url!r}; use one of {sorted(ENDPOINTS)}.",
                             param="url")
    if endpoint == "embeddings":
        line = _embedding(body)
        return JobSpec(endpoint=endpoint, model=line.model, sampling={}, body=body)
    parsed = _parsed(endpoint, body)
    return JobSpec.of(endpoint, parsed.to_generation(parsed.tier, "anonymous"), body=body)


def _embedding(body: dict[str, Any]) -> EmbeddingRequest:
    check_text(body)
    return validated(EmbeddingRequest, body)


class JobShapes:
    """jobs/runner.py's `Shapes`: a job kept as its body is the request the endpoint
    reads from that body (checked against the server's limits and the model's engine as
    the endpoint checks it), with the job's tier, tenant and cache choice; its answer is
    the endpoint's whole answer (choices, tool calls, logprobs)."""

    def __init__(self, config: RedlineConfig, pipeline: Pipeline) -> None:
        """`pipeline`: its cache's embedder, and its observers, which hear of each
        embeddings line as of a completion (rate limits, key budgets, usage)."""
        self.config, self.pipeline = config, pipeline

    def request(self, spec: JobSpec) -> GenerationRequest:
        assert spec.body is not None
        gen = _parsed(spec.endpoint, spec.body).to_generation(spec.tier, spec.tenant)
        gen.use_cache = gen.use_cache and spec.use_cache
        capabilities.check(self.config, gen)
        return gen

    def body(self, spec: JobSpec, request: GenerationRequest, model: str,
             chunks: list[Chunk], usage: Usage | None,
             finish_reason: str | None) -> dict[str, Any]:
        assert spec.endpoint != "embeddings"  # run by `embed`
        encoder = ChunkEncoder(spec.endpoint, request.id, model)
        answer: dict[str, Any] = orjson.loads(encoder.full(
            assemble(chunks, request.choices), usage, finish_reason or "stop"))
        return answer

    async def embed(self, spec: JobSpec, gate: Gate | None) -> dict[str, Any]:
        assert spec.body is not None
        body = _embedding(spec.body)
        check_model(self.config, body.model)
        line = as_request(body, spec.tenant, "B")
        if gate is not None:
            await gate.enter(spec.tenant, line, spec.key)
        code, content = await embed_told(self.config, self.pipeline, body, line)
        answer: dict[str, Any] = orjson.loads(content)
        if code >= 400:  # the upstream's 4xx, as the route passes it on
            error = answer.get("error") if isinstance(answer, dict) else None
            message = error.get("message") if isinstance(error, dict) else None
            raise InvalidRequest(str(message or f"the upstream answered {code}"))
        return answer


__all__ = ["JobShapes", "decode_body"]
