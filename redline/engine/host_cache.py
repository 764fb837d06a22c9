"""Prompt cache in host memory: KV state of prefixes the KV buffer let go.

The unified KV buffer keeps only a bounded number of idle slots' cells (every decode step
attends over the cells in use; see scheduler.py). When the scheduler forgets a slot's cells
it first copies them to host memory (`llama_state_seq_get_data`, a few MB for a
600-token prompt of a small model); a later prompt that shares a longer prefix with a
saved entry than with anything still in the buffer gets it copied back into a slot
(`llama_state_seq_set_data`) instead of recomputing it. This is what llama.cpp's own
server does with its host-memory prompt cache (`--cache-ram`), and vLLM with CPU KV
offloading: a copy costs milliseconds where the prefill costs seconds on a CPU.

This module is pure bookkeeping (tokens, sizes, least recently used first out); the
engine holds the bytes in the entries' `payload`. Everything runs on the engine's thread
(the planner's forecast reads `best` from the event loop: a torn read raises, and the
forecast tries again).

Finding the entry that shares the longest prefix with a prompt is a lookup, not a scan:
each entry is indexed by the chained hashes of its whole `BLOCK`-token blocks (as vLLM
and SGLang index their KV blocks), so `best` walks the prompt's blocks to the deepest one
some entry holds and compares only those entries token by token. A 1 GiB cache holds
hundreds of small entries, and a scan of them all, on each admission and each save, cost
milliseconds of a newcomer's first step.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from redline.engine.prefix import common_prefix

# an entry is saved only for this many tokens that no saved entry already holds: a chat
# with the same system prompt and a short new turn is not worth another copy of the prompt
MIN_NEW_TOKENS = 64
BLOCK = 16  # tokens per indexed block


def block_keys(tokens: list[int]) -> list[int]:
    """Chained hashes of `tokens`' whole blocks: key i covers tokens[: (i + 1) * BLOCK]."""
    keys: list[int] = []
    h = 0
    for i in range(0, len(tokens) - BLOCK + 1, BLOCK):
        h = hash((h, tuple(tokens[i:i + BLOCK])))
        keys.append(h)
    return keys


@dataclass(eq=False)
class Entry:
    tokens: list[int]
    payload: Any = None  # the engine's copy of the KV state (opaque here)
    size: int = 0  # bytes
    key: int = field(default=0)


class HostCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.used = 0
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # oldest use first
        self._index: dict[int, set[int]] = {}  # block key -> keys of the entries holding it
        self._keys = count(1)
        self.saves = 0
        self.restores = 0
        self.restored_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, context: list[int], limit: int) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with `context` (at most `limit` tokens)."""
        keys = block_keys(context)
        lo, hi = 0, len(keys)  # the deepest block some entry holds: keys[:lo] are all held
        while lo < hi:  # held blocks form a prefix of keys (chained), so bisect
            mid = (lo + hi) // 2
            if keys[mid] in self._index:
                lo = mid + 1
            else:
                hi = mid
        if lo:
            candidates = self._index.get(keys[lo - 1], set())
        else:  # shares no whole block: only a short prefix, if any, is worth nothing here
            candidates = set()
        best: Entry | None = None
        best_n = 0
        for key in list(candidates):
            entry = self._entries.get(key)
            if entry is None:
                continue
            n = min(common_prefix(entry.tokens, context), limit)
            if n > best_n:
                best, best_n = entry, n
        return best, best_n

    def wants(self, tokens: list[int]) -> bool:
        """Worth saving: `MIN_NEW_TOKENS` tokens more than any entry holds of it."""
        if self.capacity <= 0 or len(tokens) < MIN_NEW_TOKENS:
            return False
        _, held = self.best(tokens, len(tokens))
        return len(tokens) - held >= MIN_NEW_TOKENS

    def put(self, tokens: list[int], payload: Any, size: int) -> Entry | None:
        """Keep a state of `tokens`; entries it extends go (it holds them all), then the
        least recently used until it fits. None when it alone is over the capacity."""
        if size > self.capacity:
            return None
        for key, entry in list(self._entries.items()):
            if len(entry.tokens) <= len(tokens) and tokens[:len(entry.tokens)] == entry.tokens:
                self._drop(key)
        while self._entries and self.used + size > self.capacity:
            self._drop(next(iter(self._entries)))
        entry = Entry(list(tokens), payload, size, next(self._keys))
        self._entries[entry.key] = entry
        for k in block_keys(entry.tokens):
            self._index.setdefault(k, set()).add(entry.key)
        self.used += size
        self.saves += 1
        return entry

    def used_for(self, entry: Entry, tokens: int) -> None:
        """`entry` was copied back for a prompt that shares `tokens` of it."""
        if entry.key in self._entries:
            self._entries.move_to_end(entry.key)
        self.restores += 1
        self.restored_tokens += tokens

    def discard(self, entry: Entry) -> None:
        """A copy that could not be restored is not kept."""
        if entry.key in self._entries:
            self._drop(entry.key)

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.used -= entry.size
        entry.payload = None
        for k in block_keys(entry.tokens):
            holders = self._index.get(k)
            if holders is not None:
                holders.discard(key)
                if not holders:
                    del self._index[k]
