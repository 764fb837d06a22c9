"""A request body as a job: what a batch line or a queued request runs. The jobs
service (jobs/service.py) is handed `decode_body` and `JobShapes` by the factory
(api/services.py), so it checks a body, and answers one that is more than plain text,
exactly as the live endpoint does without importing the api."""

from __future__ import annotations

from typing import Any

import orjson

from redline.api import capabilities
from redline.api import responses_request as rq
from redline.api import responses_truncation as truncation
from redline.api.chunks import ChunkEncoder
from redline.api.embeddings import (
    LOCAL_MODEL,
    EmbeddingRequest,
    as_request,
    check_model,
    embed_told,
    encoder_request,
    told,
)
from redline.api.errors import validated
from redline.api.rerank import RerankRequest, ScoreRequest, model_of, rerank, score
from redline.api.responses_run import Run, context_of, fields_named
from redline.api.schemas import ChatCompletionRequest, CompletionRequest, not_storable
from redline.api.unicode import check_text
from redline.backends.openai_wire import error_message
from redline.config import RedlineConfig
from redline.errors import InvalidRequest
from redline.jobs.runner import Gate
from redline.jobs.spec import ENDPOINTS, Endpoint, JobSpec
from redline.pipeline import Pipeline
from redline.responses import ResponseRecords
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
    if endpoint in ("rerank", "score"):
        scored = _scored(endpoint, body)
        return JobSpec(endpoint=endpoint, model=scored.model or LOCAL_MODEL, sampling={},
                       body=body)
    if endpoint == "responses":
        asked = _response(body)
        # its input items, tools, tool_choice and text.format, checked as the batch is made
        rq.generation(asked, rq.normalize(asked.input), asked.tier, "anonymous", False)
        return JobSpec(endpoint=endpoint, model=asked.model, sampling={}, tier=asked.tier,
                       body=body)
    parsed = _parsed(endpoint, body)
    not_storable(parsed)  # what is kept is what the route answered
    return JobSpec.of(endpoint, parsed.to_generation(parsed.tier, "anonymous"), body=body)


def _embedding(body: dict[str, Any]) -> EmbeddingRequest:
    check_text(body)
    return validated(EmbeddingRequest, body)


def _scored(endpoint: Endpoint, body: dict[str, Any]) -> RerankRequest | ScoreRequest:
    check_text(body)
    if endpoint == "rerank":
        return validated(RerankRequest, body)
    return validated(ScoreRequest, body)


def _response(body: dict[str, Any]) -> rq.ResponsesRequest:
    """A /v1/responses line, checked as the route checks its body; it runs within its
    batch, so it is answered whole (`stream` is not taken as a stream, as a chat line's)
    and cannot be a background response of its own."""
    check_text(body)
    asked = rq.parse(orjson.dumps(body))
    if asked.background:
        raise InvalidRequest("A batch line runs in its batch: background is for POST "
                             "/v1/responses.", param="background")
    return asked


class JobShapes:
    """jobs/runner.py's `Shapes`: a job kept as its body is the request the endpoint
    reads from that body (checked against the server's limits and the model's engine as
    the endpoint checks it), with the job's tier, tenant and cache choice; its answer is
    the endpoint's whole answer (choices, tool calls, logprobs)."""

    def __init__(self, config: RedlineConfig, pipeline: Pipeline,
                 records: ResponseRecords) -> None:
        """`pipeline`: its cache's embedder, and its observers, which hear of each
        embeddings line as of a completion (rate limits, key budgets, usage);
        `records`: where a response line's Response is stored (and its
        previous_response_id is read), as POST /v1/responses stores one."""
        self.config, self.pipeline, self.records = config, pipeline, records

    def request(self, spec: JobSpec) -> GenerationRequest:
        assert spec.body is not None
        gen = _parsed(spec.endpoint, spec.body).to_generation(spec.tier, spec.tenant)
        gen.use_cache = gen.use_cache and spec.use_cache
        capabilities.check(self.config, gen)
        return gen

    def body(self, spec: JobSpec, request: GenerationRequest, model: str,
             chunks: list[Chunk], usage: Usage | None,
             finish_reason: str | None) -> dict[str, Any]:
        assert spec.endpoint in ("chat", "text")  # the others are run by `whole`
        encoder = ChunkEncoder(spec.endpoint, request.id, model,
                               legacy=request.legacy_functions)
        answer: dict[str, Any] = orjson.loads(encoder.full(
            assemble(chunks, request.choices), usage, finish_reason or "stop"))
        return answer

    async def whole(self, spec: JobSpec, gate: Gate | None) -> dict[str, Any]:
        if spec.endpoint == "responses":
            return await self._respond(spec, gate)
        if spec.endpoint in ("rerank", "score"):
            return await self._score(spec, gate)
        return await self._embed(spec, gate)

    async def _respond(self, spec: JobSpec, gate: Gate | None) -> dict[str, Any]:
        """The Response POST /v1/responses would answer (not streamed), stored under the
        batch's tenant unless the line says `store: false`."""
        assert spec.body is not None
        body = _response(spec.body)
        context = await context_of(self.records, body, spec.tenant)
        items = rq.normalize(body.input)
        no_cache = not spec.use_cache
        gen = rq.generation(body, context + items, spec.tier, spec.tenant, no_cache)
        with fields_named():
            capabilities.check(self.config, gen)
            if gate is not None:
                await gate.enter(spec.tenant, gen, spec.key)
            completion = await truncation.complete(
                self.pipeline, gen, body.truncation, context + items,
                lambda chain: rq.generation(body, chain, spec.tier, spec.tenant, no_cache))
        run = Run(body, gen.id.replace("req-", "resp_"), completion, self.records, items,
                  context)
        return await run.whole()

    async def _embed(self, spec: JobSpec, gate: Gate | None) -> dict[str, Any]:
        assert spec.body is not None
        body = _embedding(spec.body)
        check_model(self.config, body.model)
        line = as_request(body, spec.tenant, "B")
        if gate is not None:
            await gate.enter(spec.tenant, line, spec.key)
        return _answer(*await embed_told(self.config, self.pipeline, body, line))

    async def _score(self, spec: JobSpec, gate: Gate | None) -> dict[str, Any]:
        """What POST /v1/rerank or /v1/score answers (a remote model's engine is sent
        the line at that path)."""
        assert spec.body is not None
        body = _scored(spec.endpoint, spec.body)
        name = model_of(self.config, body.model)
        line = encoder_request(name, body.all_texts(), spec.tenant, "B", body.user)
        if gate is not None:
            await gate.enter(spec.tenant, line, spec.key)
        cache = self.pipeline.cache
        answer = (rerank(self.config, cache, "/v1/rerank", body, name)
                  if isinstance(body, RerankRequest)
                  else score(self.config, cache, "/v1/score", body, name))
        return _answer(*await told(self.pipeline, line, answer))


def _answer(code: int, content: bytes) -> dict[str, Any]:
    """An encoder's answer as a batch line's body; an upstream's 4xx, which the route
    passes on, is the line's error."""
    answer: dict[str, Any] = orjson.loads(content)
    if code >= 400:
        raise InvalidRequest(error_message(answer) or f"the upstream answered {code}")
    return answer


__all__ = ["JobShapes", "decode_body"]
