"""What a replica's prefix cache probably holds, without asking it.

Engines with prefix caching (vLLM, SGLang, llama.cpp's server, the embedded engine) keep the
KV of prompt blocks they computed and reuse it for a later prompt that starts the same way.
The gateway cannot see those caches, but it saw every prompt it sent: it hashes each prompt
in fixed blocks, each hash chained to the one before, so one hash stands for the whole
prefix up to the end of its block (as vLLM's block hashes do), and keeps per replica an LRU
set of those hashes as large as the engine's cache. The longest run of a new prompt's block
hashes found in a replica's set is the expected cache hit there.

It is approximate on purpose: blocks are cut from the prompt's UTF-8 text
(`chars_per_token` bytes a token), not from the engine's tokens, so a block boundary can
fall inside a token; prefixes shared by several prompts still hash the same, which is all the choice needs.

    >>> idx = PrefixIndex(capacity=4)
    >>> idx.add(text_blocks("a" * 200, 64))  # 3 full blocks
    >>> idx.match(text_blocks("a" * 130 + "b" * 70, 64))
    2
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from redline.types import GenerationRequest


def chain_hashes(blocks: Iterable[bytes]) -> list[bytes]:
    """One 64-bit hash per block, each covering its block and every block before it: the
    digest of the whole prefix so far (one running hash, copied at each block's end, is
    half the cost of hashing each block with the previous digest). Stable across
    processes, unlike `hash()`."""
    out: list[bytes] = []
    h = hashlib.blake2b(digest_size=8)
    for block in blocks:
        h.update(block)
        out.append(h.copy().digest())
    return out


def text_blocks(text: str, block_bytes: int) -> list[bytes]:
    """Chained hashes of `text`'s full blocks of `block_bytes` UTF-8 bytes (a partial last
    block is not cached by the engines either)."""
    data = text.encode("utf-8", "surrogatepass")
    return chain_hashes(data[i:i + block_bytes]
                        for i in range(0, len(data) - block_bytes + 1, block_bytes))


def prompt_text(request: GenerationRequest) -> str:
    """The prompt as one string in the order the engine reads it: chat turns framed by
    role with separators no text contains, so two conversations that differ only in where
    one turn ends and the next begins do not hash the same."""
    if request.messages is not None:
        return "".join(f"\x1e{m.role}\x1f{m.content}" for m in request.messages)
    return request.prompt or ""


class PrefixIndex:
    """An LRU set of chained block hashes, `capacity` blocks at most."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a prefix index needs a capacity of at least one block")
        self.capacity = capacity
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, blocks: Sequence[bytes]) -> int:
        """How many of `blocks`, from the first, are held: the expected hit in blocks."""
        held = self._blocks
        n = 0
        for h in blocks:
            if h not in held:
                break
            n += 1
        return n

    def add(self, blocks: Sequence[bytes]) -> None:
        """The engine computed (or reused) these blocks: they are now its most recent.
        Inserted last block first, so a prefix's first blocks are evicted after its tail
        (vLLM frees a request's blocks in that order, for the same reason: the head is what
        other prompts share)."""
        held = self._blocks
        for h in reversed(blocks):
            if h in held:
                held.move_to_end(h)
            else:
                held[h] = None
        while len(held) > self.capacity:
            held.popitem(last=False)
