"""Files of the Batch API (input JSONL, output and error files), kept in the job
records store so that every worker that can see a batch can read its input.

Every file belongs to a tenant (the uploader, or the batch whose output it is). A
file of another tenant is not found: the answer is the same as for an id that never
existed, so an id tells nothing about other tenants' files."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from redline.jobs.model import tenant_index
from redline.jobs.records import RecordStore, Write

META, DATA = "file:", "filedata:"
OWNER = "tenant"  # the stored meta's owner field; never part of the File object


def public(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if k != OWNER}


def _indexes(meta: dict[str, Any], score: float | None) -> dict[str, float | None]:
    tenant = meta.get(OWNER, "anonymous")
    return {tenant_index(tenant, "files"): score,
            tenant_index(tenant, "files:" + str(meta.get("purpose"))): score}


class FileStore:
    def __init__(self, records: RecordStore) -> None:
        self.records = records

    async def create(self, file_id: str, content: bytes, filename: str, purpose: str,
                     tenant: str) -> dict[str, Any]:
        """Store a file of `tenant`; with an id that exists already, the first one stays
        (a batch that is finalised twice after a crash writes the same output file once)."""
        now = time.time()
        meta = {"id": file_id, "object": "file", "bytes": len(content),
                "created_at": int(now), "filename": filename, "purpose": purpose,
                "status": "processed", "status_details": None, "expires_at": None,
                OWNER: tenant}

        def create() -> dict[str, Any]:
            existing = self.records.get(META + file_id)
            if existing is not None:
                found: dict[str, Any] = json.loads(existing)
                return found
            self.records.put(DATA + file_id, content)  # data before meta: meta means complete
            self.records.transact(META + file_id, lambda old: None if old is not None else
                                  Write(json.dumps(meta).encode(), _indexes(meta, now)))
            made: dict[str, Any] = json.loads(self.records.get(META + file_id) or b"{}")
            return made

        return public(await asyncio.to_thread(create))

    async def _meta(self, file_id: str, tenant: str) -> dict[str, Any] | None:
        raw = await asyncio.to_thread(self.records.get, META + file_id)
        if raw is None:
            return None
        meta: dict[str, Any] = json.loads(raw)
        return meta if meta.get(OWNER, "anonymous") == tenant else None

    async def get(self, file_id: str, tenant: str) -> dict[str, Any] | None:
        """The File object, or None when there is none of `tenant`'s with this id."""
        meta = await self._meta(file_id, tenant)
        return None if meta is None else public(meta)

    async def content(self, file_id: str, tenant: str) -> bytes | None:
        if await self._meta(file_id, tenant) is None:
            return None
        return await asyncio.to_thread(self.records.get, DATA + file_id)

    async def list(self, tenant: str, purpose: str | None, after: str | None,
                   limit: int) -> tuple[list[dict[str, Any]], bool]:
        """One page of `tenant`'s files, newest first, and whether more follow."""
        index = tenant_index(tenant, "files" if purpose is None else "files:" + purpose)
        rows = await asyncio.to_thread(self.records.page, index, limit + 1,
                                       None if after is None else META + after)
        out = []
        for key, _ in rows[:limit]:
            meta = await self.get(key[len(META):], tenant)
            if meta is not None:
                out.append(meta)
        return out, len(rows) > limit

    async def delete(self, file_id: str, tenant: str) -> bool:
        def delete() -> bool:
            raw = self.records.get(META + file_id)
            if raw is None or json.loads(raw).get(OWNER, "anonymous") != tenant:
                return False
            meta = json.loads(raw)
            self.records.transact(META + file_id, lambda old: Write(b"{}", _indexes(meta, None)))
            self.records.delete(META + file_id)
            self.records.delete(DATA + file_id)
            return True

        return await asyncio.to_thread(delete)
