"""Jobs: `GET /v1/jobs/{id}`, `DELETE /v1/jobs/{id}`, and the 202 answer that
/v1/chat/completions and /v1/completions give for tier B or `"background": true`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from redline.api.keyring import key_label
from redline.api.schemas import ChatCompletionRequest, CompletionRequest, not_storable
from redline.api.services import services_of
from redline.api.tenant import tenant_of
from redline.errors import InvalidRequest, NotFound
from redline.jobs.service import JobService, describe
from redline.jobs.spec import Endpoint, JobSpec
from redline.pipeline import Pipeline
from redline.types import GenerationRequest

router = APIRouter()


def _jobs(request: Request) -> JobService:
    return services_of(request.app).jobs


def idempotency_key(request: Request) -> str | None:
    """`Idempotency-Key`: a retried submission with the same key (and tenant) returns
    the first job instead of running the request twice."""
    key = request.headers.get("idempotency-key")
    if key is not None and not 1 <= len(key) <= 255:
        raise InvalidRequest("Idempotency-Key must be 1 to 255 characters.",
                             param="Idempotency-Key")
    return key


def wants_job(body: ChatCompletionRequest | CompletionRequest, gen: GenerationRequest,
              pipeline: Pipeline) -> bool:
    """`"background": true` or tier B asked for. `auto` never turns a request into a job:
    an OpenAI client that did not ask for one cannot read a 202 (the router serves it as A)."""
    return bool(body.background or gen.tier == "B")


async def accept(request: Request, body: ChatCompletionRequest | CompletionRequest,
                 gen: GenerationRequest, kind: str) -> JSONResponse:
    """Queue the request as a job: 202 with the job object."""
    not_storable(body)  # a stored completion is what the route answered, not a job's
    # 404 or a capability's 400 now, not in the job ("auto" stays; the worker plans it)
    services_of(request.app).pipeline.router.check(gen)
    gen.tier = "B"  # the worker serves it with tier B's budget (no tier-S shortening)
    notify = body.notify.model_dump(exclude_none=True) if body.notify else {}
    endpoint: Endpoint = "chat" if kind == "chat" else "text"
    # the body as sent (unknown fields too): read again when the job runs, if not plain
    sent = body.model_dump(mode="json", exclude_unset=True)
    job = await _jobs(request).submit(JobSpec.of(endpoint, gen, key_label(request.scope), sent),
                                      {k: v for k, v in notify.items()
                                       if k in ("webhook", "email")},
                                      idempotency_key(request))
    return JSONResponse(job.public(), status_code=202,
                        headers={"Location": f"/v1/jobs/{job.id}", "X-Redline-Tier": "B"})


@router.get("/v1/jobs/{job_id}")
async def get_job(job_id: str, request: Request) -> dict[str, Any]:
    job = await _jobs(request).get(job_id, tenant_of(request))
    if job is None:
        raise NotFound(f"No job with id {job_id!r}.", param="job_id")
    return describe(job)


@router.delete("/v1/jobs/{job_id}")
async def cancel_job(job_id: str, request: Request) -> dict[str, Any]:
    tenant = tenant_of(request)
    job = await _jobs(request).get(job_id, tenant)
    if job is None or job.kind != "completion":  # a batch is cancelled as a batch
        raise NotFound(f"No job with id {job_id!r}.", param="job_id")
    return (await _jobs(request).cancel(job_id, tenant) or job).public()


@router.get("/v1/webhook_secret")
async def webhook_secret(request: Request) -> dict[str, Any]:
    """The caller's own webhook signing secret: its notifications carry a Standard
    Webhooks signature (webhook-id, webhook-timestamp, webhook-signature) made with it."""
    secret = await _jobs(request).notifier.secret(tenant_of(request))
    return {"object": "webhook_secret", "secret": secret, "scheme": "standard-webhooks-v1"}
