"""The request a job carries across the queue, plus which OpenAI endpoint shape its
answer takes: a typed, JSON-serialisable copy of a plain `GenerationRequest` (text and
sampling), or, for any other (tools, response_format, logprobs, n, images, fields passed
on to a remote engine), the body the client sent, which the api reads again when the job
runs (jobs/runner.py `Shapes`), so that the answer is the one the endpoint gives."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from redline.errors import InvalidRequest
from redline.routing.names import parse_tier
from redline.types import GenerationRequest, Message, SamplingParams

Endpoint = Literal["chat", "text", "embeddings", "responses", "rerank", "score"]
ENDPOINTS: dict[str, Endpoint] = {"/v1/chat/completions": "chat", "/v1/completions": "text",
                                  # batches only: answered whole by the api (Shapes.whole)
                                  "/v1/embeddings": "embeddings", "/v1/responses": "responses",
                                  "/v1/rerank": "rerank", "/v1/score": "score"}  # vLLM's
WHOLE: tuple[Endpoint, ...] = ("embeddings", "responses", "rerank", "score")


@dataclass(frozen=True)
class JobSpec:
    endpoint: Endpoint
    model: str
    sampling: dict[str, Any]
    messages: list[tuple[str, str]] | None = None
    prompt: str | None = None
    tier: str | None = None
    tenant: str = "anonymous"
    use_cache: bool = True
    user: str | None = None
    refresh_cache: bool = False  # scheduled precompute: skip the lookup, store the answer
    key: str | None = None  # the API key it was made with (its budget and usage); None: none
    body: dict[str, Any] | None = None  # the client's body, for a request that is not plain

    @classmethod
    def of(cls, endpoint: Endpoint, req: GenerationRequest, key: str | None = None,
           body: dict[str, Any] | None = None) -> JobSpec:
        """`req` as a job; `body`, the request's JSON body, is kept (and read again when
        the job runs) when `req` is more than text and sampling."""
        if not req.is_plain():
            if body is None:  # the typed copy holds text and sampling only: refuse, never drop
                raise InvalidRequest("Scheduled jobs take plain text requests only (no tools, "
                                     "response_format, logprobs, n, penalties or "
                                     "passed-through fields).", param="body")
            return cls(endpoint=endpoint, model=req.model, sampling={}, tier=req.tier,
                       tenant=req.tenant, use_cache=req.use_cache, user=req.user, key=key,
                       body=body)
        sampling = asdict(req.sampling)
        sampling["stop"] = list(req.sampling.stop)
        return cls(endpoint=endpoint, model=req.model, sampling=sampling,
                   messages=None if req.messages is None else
                   [(m.role, m.content) for m in req.messages],
                   prompt=req.prompt, tier=req.tier, tenant=req.tenant,
                   use_cache=req.use_cache, user=req.user, key=key)

    def request(self) -> GenerationRequest:
        """A fresh request (new id, arrival now), as if it had just come in (a plain one:
        a spec with a `body` is read by the api's `Shapes`)."""
        if self.body is not None:
            raise ValueError("this job's request is its body: the api reads it")
        sampling = dict(self.sampling)
        sampling["stop"] = tuple(sampling.get("stop") or ())
        return GenerationRequest(
            model=self.model, sampling=SamplingParams(**sampling),
            messages=None if self.messages is None else
            tuple(Message(r, c) for r, c in self.messages),
            prompt=self.prompt, tier=parse_tier(self.tier),
            tenant=self.tenant, use_cache=self.use_cache, user=self.user)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobSpec:
        messages = d.get("messages")
        return cls(**{**d, "messages": None if messages is None else
                      [tuple(m) for m in messages]})
