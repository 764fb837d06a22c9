"""Where state lives: `open_store(url)` gives a `Store` (memory, SQLite or Redis)."""

from redline.store.base import Store, StoreUnavailable
from redline.store.factory import open_store

__all__ = ["Store", "StoreUnavailable", "open_store"]
