"""Files of the Batch API (input JSONL, output and error files), kept in the job
records store so that every worker that can see a batch can read its input."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from redline.jobs.records import RecordStore, Write

META, DATA, INDEX = "file:", "filedata:", "files"


class FileStore:
    def __init__(self, records: RecordStore) -> None:
        self.records = records

    async def create(self, file_id: str, content: bytes, filename: str, purpose: str) -> dict[str, Any]:
        """Store a file; with an id that exists already, the first one stays (a batch that
        is finalised twice after a crash writes the same output file once)."""
        meta = {"id": file_id, "object": "file", "bytes": len(content),
                "created_at": int(time.time()), "filename": filename, "purpose": purpose,
                "status": "processed", "status_details": None, "expires_at": None}

        def create() -> dict[str, Any]:
            existing = self.records.get(META + file_id)
            if existing is not None:
                return json.loads(existing)  # type: ignore[no-any-return]
            self.records.put(DATA + file_id, content)  # data before meta: meta means complete
            self.records.transact(META + file_id, lambda old: None if old is not None else
                                  Write(json.dumps(meta).encode(), {INDEX: time.time()}))
            return json.loads(self.records.get(META + file_id) or b"{}")  # type: ignore[no-any-return]

        return await asyncio.to_thread(create)

    async def get(self, file_id: str) -> dict[str, Any] | None:
        raw = await asyncio.to_thread(self.records.get, META + file_id)
        return None if raw is None else json.loads(raw)

    async def content(self, file_id: str) -> bytes | None:
        return await asyncio.to_thread(self.records.get, DATA + file_id)

    async def list(self) -> list[dict[str, Any]]:
        rows = await asyncio.to_thread(self.records.members, INDEX)
        out = []
        for key, _ in reversed(rows):
            meta = await self.get(key[len(META):])
            if meta is not None:
                out.append(meta)
        return out

    async def delete(self, file_id: str) -> bool:
        def delete() -> bool:
            if self.records.get(META + file_id) is None:
                return False
            self.records.transact(META + file_id, lambda old: Write(b"{}", {INDEX: None}))
            self.records.delete(META + file_id)
            self.records.delete(DATA + file_id)
            return True

        return await asyncio.to_thread(delete)
