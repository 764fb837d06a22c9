"""Finding the key a request presents: the configured keys (by sha256 digest, compared in
constant time) and the managed keys in the store (/v1/admin/keys), each found one
remembered briefly. Apart from api/auth.py so that api/services.py can build the managed
keys without importing the middleware (which reads the services)."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Sequence

from starlette.types import Scope

from redline.config import ApiKey
from redline.store.keys import KeyRecord, KeyStore


def digest(key: str) -> str:
    """The sha256 hex digest to store in `auth.keys[].sha256`.

    >>> digest("sk-test")[:12]
    'f3abf2a6cc4f'
    """
    return hashlib.sha256(key.encode()).hexdigest()


class KeyRing:
    """Digest → key entry. A lookup hashes the presented key once; the digest compare is
    constant-time so a wrong key's timing tells nothing about the right ones."""

    def __init__(self, keys: Sequence[ApiKey]) -> None:
        self.by_digest = {k.sha256.lower(): k for k in keys}

    def __bool__(self) -> bool:
        return bool(self.by_digest)

    def find(self, presented: str) -> ApiKey | None:
        wanted = digest(presented)
        found = None
        for known, key in self.by_digest.items():
            if hmac.compare_digest(known, wanted):
                found = key
        return found


def bearer(headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


class ManagedKeys:
    """The store's keys, each found one remembered for `ttl_s` (digest -> record, until)."""

    def __init__(self, keys: KeyStore, ttl_s: float) -> None:
        self.keys, self.ttl_s = keys, ttl_s
        self.seen: dict[str, tuple[KeyRecord, float]] = {}
        self.ids: dict[str, tuple[KeyRecord | None, float]] = {}  # key id -> record, until

    async def find(self, presented: str) -> KeyRecord | None:
        wanted = digest(presented)
        now = time.monotonic()
        hit = self.seen.get(wanted)
        if hit is not None and hit[1] > now:
            return hit[0]
        record = await self.keys.find(wanted)
        if record is None:
            self.seen.pop(wanted, None)
            return None
        if len(self.seen) > 10_000:  # bounded: drop what has expired
            self.seen = {d: v for d, v in self.seen.items() if v[1] > now}
        self.seen[wanted] = (record, now + self.ttl_s)
        return record

    async def by_id(self, key_id: str) -> KeyRecord | None:
        """The record of a managed key by its id (what a job carries to be charged to
        it), remembered for `ttl_s` like a lookup by secret; None once revoked."""
        now = time.monotonic()
        hit = self.ids.get(key_id)
        if hit is not None and hit[1] > now:
            return hit[0]
        record = await self.keys.get(key_id)
        if len(self.ids) > 10_000:
            self.ids = {i: v for i, v in self.ids.items() if v[1] > now}
        self.ids[key_id] = (record, now + self.ttl_s)
        return record

    def forget(self, sha256: str, key_id: str | None = None) -> None:
        """This replica stops accepting a revoked or rotated key at once (`key_id`: a
        revoked one's id, so that its queued jobs stop here at once too)."""
        self.seen.pop(sha256, None)
        if key_id is not None:
            self.ids.pop(key_id, None)


def key_label(scope: Scope) -> str:
    """The key a request came with, as usage names it: a managed key's id, a config key's
    name, or "-" (no key)."""
    state = scope.get("state", {})
    if state.get("key_id"):
        return str(state["key_id"])
    key = state.get("api_key")
    return key.name if key is not None else "-"


__all__ = ["KeyRing", "ManagedKeys", "bearer", "digest", "key_label"]
