"""Managed API keys: create, list, rotate and revoke at run time (admin only).

    POST   /v1/admin/keys               {"tenant", "role", "models", "rpm", "tpm",
                                         "max_concurrent", "budget_tokens", "budget_period_s"}
                                        → the key object with its `key` (shown this once)
    GET    /v1/admin/keys?limit&after&tenant   a page of key objects (never a secret)
    GET    /v1/admin/keys/{id}
    POST   /v1/admin/keys/{id}/rotate   → a new `key` for the same key object; the old fails
    DELETE /v1/admin/keys/{id}          → revoked: refused at once here, within
                                          `auth.key_cache_s` on every other replica

Keys live in the store (store/keys.py): SQLite on the embedded default, Redis when
`store.url` is redis:// (every replica sees them). Keys from the config file keep working
and are not listed here. A keyed server is needed (at least one config key): on an open
server every caller is admin and a key would change nothing.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from redline.api.auth import ManagedKeys, require_admin
from redline.api.openai_routes import model_ids
from redline.api.services import services_of
from redline.config import ApiKey
from redline.errors import InvalidRequest, NotFound
from redline.store.keys import KeyRecord

router = APIRouter(dependencies=[Depends(require_admin)])  # operators only


class NewKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(..., min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.@:-]+$",
                        description="whose objects and limits the key's requests are")
    role: Literal["admin", "user"] = "user"
    models: list[str] | None = Field(None, description="the models it may use; None: all")
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    max_concurrent: int | None = Field(None, ge=1)
    budget_tokens: int | None = Field(None, ge=1)
    budget_period_s: int = Field(30 * 86400, ge=60)


def _managed(request: Request) -> ManagedKeys:
    if not services_of(request.app).config.auth.keys:
        raise InvalidRequest("Managed keys need a keyed server: configure at least one key "
                             "(an admin) in auth.keys.", code="keys_not_enabled")
    keys: ManagedKeys = services_of(request.app).keys
    return keys


def _not_found(key_id: str) -> NotFound:
    return NotFound(f"No API key with id '{key_id}'.", param="key_id")


def _names(request: Request, models: list[str] | None) -> None:
    known = set(model_ids(services_of(request.app)))
    for i, name in enumerate(models or ()):
        if name not in known:
            raise InvalidRequest(f"Unknown model '{name}'.", param=f"models.{i}")


def _with_secret(record: KeyRecord, secret: str) -> dict[str, Any]:
    return record.public() | {"key": secret}


@router.post("/v1/admin/keys")
async def create(body: NewKey, request: Request) -> dict[str, Any]:
    keys = _managed(request)
    _names(request, body.models)
    spec = ApiKey(name=body.tenant, sha256="0" * 64, role=body.role, models=body.models,
                  rpm=body.rpm, tpm=body.tpm, max_concurrent=body.max_concurrent,
                  budget_tokens=body.budget_tokens, budget_period_s=body.budget_period_s)
    record, secret = await keys.keys.create(spec)
    return _with_secret(record, secret)


@router.get("/v1/admin/keys")
async def list_keys(request: Request, limit: int = Query(20, ge=1, le=100),
                    after: str | None = None, tenant: str | None = None) -> dict[str, Any]:
    records, more = await _managed(request).keys.list(after, limit, tenant)
    data = [r.public() for r in records]
    return {"object": "list", "data": data, "has_more": more,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


@router.get("/v1/admin/keys/{key_id}")
async def get_key(key_id: str, request: Request) -> dict[str, Any]:
    record = await _managed(request).keys.get(key_id)
    if record is None:
        raise _not_found(key_id)
    return record.public()


@router.post("/v1/admin/keys/{key_id}/rotate")
async def rotate(key_id: str, request: Request) -> dict[str, Any]:
    keys = _managed(request)
    old = await keys.keys.get(key_id)
    made = await keys.keys.rotate(key_id)
    if old is None or made is None:
        raise _not_found(key_id)
    keys.forget(old.key.sha256)
    return _with_secret(*made)


@router.delete("/v1/admin/keys/{key_id}")
async def revoke(key_id: str, request: Request) -> dict[str, Any]:
    keys = _managed(request)
    record = await keys.keys.revoke(key_id)
    if record is None:
        raise _not_found(key_id)
    keys.forget(record.key.sha256, key_id)
    return {"id": key_id, "object": "api_key.deleted", "deleted": True}
