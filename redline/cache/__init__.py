"""The response cache: exact and semantic, tenant-scoped, over any store."""

from redline.cache.response_cache import CachedAnswer, Lookup, ResponseCache

__all__ = ["CachedAnswer", "Lookup", "ResponseCache"]
