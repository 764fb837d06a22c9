"""`open_store(url)`: the one place a store is chosen, by URL scheme.

    memory://[?max_keys=N]          this process only (LRU + TTL)
    sqlite:///relative/path.db      embedded, survives restart (SQLAlchemy's convention:
    sqlite:////absolute/path.db     three slashes then the path; a 4th slash makes it absolute)
    redis://host:port/db            shared by every replica (also rediss://, unix://)

Construction never does I/O: connections open on first use, so `create_app` stays sync.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from redline.store.base import Store

SCHEMES = ("memory", "sqlite", "redis", "rediss", "unix")


def open_store(url: str) -> Store:
    parts = urlsplit(url)
    scheme = parts.scheme
    if scheme == "memory":
        from redline.store.memory import DEFAULT_MAX_KEYS, MemoryStore

        query = parse_qs(parts.query)
        max_keys = int(query.get("max_keys", [DEFAULT_MAX_KEYS])[0])
        return MemoryStore(url, max_keys=max_keys)
    if scheme == "sqlite":
        from redline.store.sqlite import SQLiteStore

        prefix = "sqlite:///"
        if not url.startswith(prefix) or len(url) == len(prefix):
            raise ValueError(f"store url {url!r}: expected sqlite:///relative.db or sqlite:////abs.db")
        return SQLiteStore(url[len(prefix):], url)
    if scheme in ("redis", "rediss", "unix"):
        from redline.store.redis_store import RedisStore

        return RedisStore(url)
    raise ValueError(f"store url {url!r}: the scheme must be one of {', '.join(SCHEMES)}")
