"""The OpenAI Files and Batch APIs, as the official client calls them:
/v1/files (multipart upload, purpose "batch"), /v1/files/{id}, /v1/files/{id}/content,
/v1/batches (create, list), /v1/batches/{id}, /v1/batches/{id}/cancel.

Each object is its tenant's: another tenant's id answers 404, as an unknown id does, and
lists page through the caller's own index."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from redline.api.jobs_routes import idempotency_key
from redline.api.keyring import key_label
from redline.api.schemas import Notify
from redline.api.services import services_of
from redline.api.tenant import tenant_of
from redline.errors import InvalidRequest, NotFound, PayloadTooLarge
from redline.jobs.batch import describe_batch
from redline.jobs.service import JobService
from redline.jobs.spec import ENDPOINTS
from redline.types import new_id

router = APIRouter()

PURPOSES = ("batch",)


def _jobs(request: Request) -> JobService:
    return services_of(request.app).jobs


def _page(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}


def _limit(limit: int) -> int:
    if not 1 <= limit <= 10000:
        raise InvalidRequest("limit must be between 1 and 10000", param="limit")
    return limit


# -- files -----------------------------------------------------------------------------------
@router.post("/v1/files")
async def upload_file(request: Request, file: Annotated[UploadFile, File()],
                      purpose: Annotated[str, Form()]) -> dict[str, Any]:
    if purpose not in PURPOSES:
        raise InvalidRequest(f"purpose must be one of {list(PURPOSES)}", param="purpose")
    cap = services_of(request.app).config.jobs.max_file_bytes
    content = await file.read(cap + 1)
    if len(content) > cap:
        raise PayloadTooLarge(f"The file is larger than the limit of {cap} bytes.")
    if not content.strip():
        raise InvalidRequest("The file is empty.", param="file")
    return await _jobs(request).files.create(new_id("file"), content,
                                             file.filename or "upload.jsonl", purpose,
                                             tenant_of(request))


@router.get("/v1/files")
async def list_files(request: Request, purpose: str | None = None, after: str | None = None,
                     limit: int = 10000) -> dict[str, Any]:
    files, more = await _jobs(request).files.list(tenant_of(request), purpose, after,
                                                  _limit(limit))
    return _page(files, more)


@router.get("/v1/files/{file_id}")
async def get_file(file_id: str, request: Request) -> dict[str, Any]:
    meta = await _jobs(request).files.get(file_id, tenant_of(request))
    if meta is None:
        raise NotFound(f"No such File object: {file_id}", param="id")
    return meta


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request) -> Response:
    content = await _jobs(request).files.content(file_id, tenant_of(request))
    if content is None:
        raise NotFound(f"No such File object: {file_id}", param="id")
    return Response(content, media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, request: Request) -> dict[str, Any]:
    if not await _jobs(request).files.delete(file_id, tenant_of(request)):
        raise NotFound(f"No such File object: {file_id}", param="id")
    return {"id": file_id, "object": "file", "deleted": True}


# -- batches ---------------------------------------------------------------------------------
class CreateBatch(BaseModel):
    model_config = ConfigDict(extra="allow")

    input_file_id: str = Field(..., min_length=1)
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    notify: Notify | None = None  # redline extension: announce the finished batch


@router.post("/v1/batches")
async def create_batch(body: CreateBatch, request: Request) -> dict[str, Any]:
    if body.endpoint not in ENDPOINTS:
        raise InvalidRequest(f"endpoint must be one of {sorted(ENDPOINTS)}", param="endpoint")
    if body.completion_window != "24h":
        raise InvalidRequest("completion_window must be '24h'", param="completion_window")
    await services_of(request.app).gate.check_budget(request.scope)  # spent: 429 now
    notify = body.notify.model_dump(exclude_none=True) if body.notify else {}
    job = await _jobs(request).submit_batch(
        body.input_file_id, body.endpoint, body.completion_window, body.metadata,
        tenant=tenant_of(request),
        notify={k: v for k, v in notify.items() if k in ("webhook", "email")},
        idempotency_key=idempotency_key(request), key=key_label(request.scope))
    return describe_batch(job)


@router.get("/v1/batches")
async def list_batches(request: Request, after: str | None = None,
                       limit: int = 20) -> dict[str, Any]:
    jobs, more = await _jobs(request).list_batches(tenant_of(request), after, _limit(limit))
    return _page([describe_batch(j) for j in jobs], more)


@router.get("/v1/batches/{batch_id}")
async def get_batch(batch_id: str, request: Request) -> dict[str, Any]:
    job = await _jobs(request).get(batch_id, tenant_of(request))
    if job is None or job.kind != "batch":
        raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
    return describe_batch(job)


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request) -> dict[str, Any]:
    tenant = tenant_of(request)
    job = await _jobs(request).get(batch_id, tenant)
    if job is None or job.kind != "batch":
        raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
    job = await _jobs(request).cancel(batch_id, tenant) or job
    return describe_batch(job)
