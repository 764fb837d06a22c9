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
engine holds the bytes in the entries' `payload`. Everything runs on the engine's thread.
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
        self._keys = count(1)
        self.saves = 0
        self.restores = 0
        self.restored_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, context: list[int], limit: int) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with `context` (at most `limit` tokens)."""
        best: Entry | None = None
        best_n = 0
        for entry in self._entries.values():
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
