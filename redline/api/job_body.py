"""A request body as a job: what a batch line or a queued request runs. The jobs
service (jobs/service.py) is handed `decode_body` and `JobShapes` by the factory
(api/services.py), so it checks a body, and answers one that is more than plain text,
exactly as the live endpoint does without importing the api."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from redline.api import capabilities
from redline.api.chunks import ChunkEncoder
from redline.api.errors import validation_error
from redline.api.schemas import ChatCompletionRequest, CompletionRequest
from redline.api.unicode import check_text
from redline.config import RedlineConfig
from redline.errors import InvalidRequest
from redline.jobs.spec import ENDPOINTS, Endpoint, JobSpec
from redline.types import Chunk, GenerationRequest, Usage, assemble


def _parsed(endpoint: Endpoint, body: dict[str, Any]) -> ChatCompletionRequest | CompletionRequest:
    schema = ChatCompletionRequest if endpoint == "chat" else CompletionRequest
    check_text(body)
    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        raise validation_error(RequestValidationError(exc.errors())) from exc


def decode_body(url: str, body: dict[str, Any]) -> JobSpec:
    """A request body of `url` (a batch line, a scheduled job) as a job spec; bad bodies
    raise InvalidRequest just as the live endpoint would answer them."""
    endpoint = ENDPOINTS.get(url)
    if endpoint is None:
        raise InvalidRequest(f"Unsupported url {url!r}; use one of {sorted(ENDPOINTS)}.",
                             param="url")
    parsed = _parsed(endpoint, body)
    return JobSpec.of(endpoint, parsed.to_generation(parsed.tier, "anonymous"), body=body)


class JobShapes:
    """jobs/runner.py's `Shapes`: a job kept as its body is the request the endpoint
    reads from that body (checked against the server's limits and the model's engine as
    the endpoint checks it), with the job's tier, tenant and cache choice; its answer is
    the endpoint's whole answer (choices, tool calls, logprobs)."""

    def __init__(self, config: RedlineConfig) -> None:
        self.config = config

    def request(self, spec: JobSpec) -> GenerationRequest:
        assert spec.body is not None
        gen = _parsed(spec.endpoint, spec.body).to_generation(spec.tier, spec.tenant)
        gen.use_cache = gen.use_cache and spec.use_cache
        capabilities.check(self.config, gen)
        return gen

    def body(self, spec: JobSpec, request: GenerationRequest, model: str,
             chunks: list[Chunk], usage: Usage | None,
             finish_reason: str | None) -> dict[str, Any]:
        encoder = ChunkEncoder(spec.endpoint, request.id, model)
        answer: dict[str, Any] = orjson.loads(encoder.full(
            assemble(chunks, request.choices), usage, finish_reason or "stop"))
        return answer


__all__ = ["JobShapes", "decode_body"]
