"""API keys managed at run time (POST /v1/admin/keys), kept in the store.

Only the key's sha256 digest is kept; the plain key is returned once, when it is made or
rotated. Two kinds of entries, in whatever store the server uses (SQLite by default,
Redis when `store.url` is redis://, so every replica sees the same keys):

    apikey:sha:<digest>   the key's record (JSON): what a request's lookup reads, one get
    apikeys               hash: key id -> the same record, for listing and by-id edits

A key's record is an `ApiKey` (config.py: name = tenant, role, limits, allowlist, budget)
plus its id, a hint of the plain key (its last four characters) and when it was made.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from redline.config import ApiKey
from redline.store.base import Store

INDEX = "apikeys"
PREFIX = "sk-rl-"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(32)  # 256 random bits


@dataclass(frozen=True)
class KeyRecord:
    id: str
    key: ApiKey
    hint: str  # "sk-rl-...abcd": enough to tell keys apart, not to use one
    created_at: float
    rotated_at: float | None = None

    def to_json(self) -> bytes:
        return json.dumps({"id": self.id, "key": self.key.model_dump(), "hint": self.hint,
                           "created_at": self.created_at, "rotated_at": self.rotated_at}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> KeyRecord:
        d = json.loads(raw)
        return cls(d["id"], ApiKey.model_validate(d["key"]), d["hint"], d["created_at"],
                   d.get("rotated_at"))

    def public(self) -> dict[str, Any]:
        """The record as the admin API shows it: never the digest."""
        k = self.key
        return {"id": self.id, "object": "api_key", "tenant": k.name, "role": k.role,
                "models": k.models, "rpm": k.rpm, "tpm": k.tpm,
                "max_concurrent": k.max_concurrent, "budget_tokens": k.budget_tokens,
                "budget_period_s": k.budget_period_s, "redacted_value": self.hint,
                "created_at": int(self.created_at),
                "rotated_at": None if self.rotated_at is None else int(self.rotated_at)}


def _hint(secret: str) -> str:
    return f"{PREFIX}...{secret[-4:]}"


class KeyStore:
    """Create, find, list, rotate and revoke managed keys in `store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def create(self, key: ApiKey) -> tuple[KeyRecord, str]:
        """Keep `key` (its sha256 is replaced by a fresh secret's): the record and the
        plain secret, which is not kept anywhere."""
        secret = new_secret()
        record = KeyRecord("key_" + secrets.token_hex(12),
                           key.model_copy(update={"sha256": digest(secret)}),
                           _hint(secret), time.time())
        await self._put(record)
        return record, secret

    async def _put(self, record: KeyRecord) -> None:
        raw = record.to_json()
        # the lookup entry first: a key listed is a key that works
        await self.store.set(f"apikey:sha:{record.key.sha256}", raw)
        await self.store.hset(INDEX, record.id, raw)

    async def find(self, sha256: str) -> KeyRecord | None:
        raw = await self.store.get(f"apikey:sha:{sha256}")
        return None if raw is None else KeyRecord.from_json(raw)

    async def get(self, key_id: str) -> KeyRecord | None:
        raw = (await self.store.hgetall(INDEX)).get(key_id)
        return None if raw is None else KeyRecord.from_json(raw)

    async def list(self, after: str | None, limit: int,
                   tenant: str | None = None) -> tuple[list[KeyRecord], bool]:
        """A page of records in id order (ids are random: a stable order to page in)."""
        records = sorted((KeyRecord.from_json(v) for v in (await self.store.hgetall(INDEX)).values()),
                         key=lambda r: r.id)
        records = [r for r in records if (after is None or r.id > after)
                   and (tenant is None or r.key.name == tenant)]
        return records[:limit], len(records) > limit

    async def rotate(self, key_id: str) -> tuple[KeyRecord, str] | None:
        """A new secret for the same key (tenant, role, limits, usage); the old one stops
        working at once here, and within `auth.key_cache_s` on other replicas."""
        old = await self.get(key_id)
        if old is None:
            return None
        secret = new_secret()
        record = KeyRecord(old.id, old.key.model_copy(update={"sha256": digest(secret)}),
                           _hint(secret), old.created_at, time.time())
        await self._put(record)
        await self.store.delete(f"apikey:sha:{old.key.sha256}")
        return record, secret

    async def revoke(self, key_id: str) -> KeyRecord | None:
        record = await self.get(key_id)
        if record is None:
            return None
        await self.store.delete(f"apikey:sha:{record.key.sha256}")  # refused from now on
        await self.store.hdel(INDEX, key_id)
        return record


__all__ = ["KeyRecord", "KeyStore", "digest", "new_secret"]
