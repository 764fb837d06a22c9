"""What a replica's prefix cache probably holds, without asking it.

Engines with prefix caching (vLLM, SGLang, llama.cpp's server, the embedded engine) keep the
KV of prompt blocks they computed and reuse it for a later prompt that starts the same way.
The gateway cannot see those caches, but it saw every prompt it sent: it hashes each prompt
in fixed blocks, each hash chained to the one before, so one hash stands for the whole
prefix up to the end of its block (as vLLM's block hashes do), and keeps per replica an LRU
set of those hashes as large as the engine's cache. The longest run of a new prompt's block
hashes found in a replica's set is the expected cache hit there.

It is approximate on purpose: blocks are cut from the prompt's text (`chars_per_token`
characters a token), not from the engine's tokens, so a block boundary can fall inside a
token; prefixes shared by several prompts still hash the same, which is all the choice needs.

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


def chain_hashes(blocks: Iterable[bytes]) -> list[int]:
    """One 64-bit hash per block, each covering its block and every block before it."""
    out: list[int] = []
    prev = b""
    for block in blocks:
        prev = hashlib.blake2b(prev + block, digest_size=8).digest()
        out.append(int.from_bytes(prev, "little"))
    return out


def text_blocks(text: str, block_chars: int) -> list[int]:
    """Chained hashes of `text`'s full blocks of `block_chars` characters (a partial last
    block is not cached by the engines either)."""
    n = len(text) // block_chars
    return chain_hashes(text[i * block_chars:(i + 1) * block_chars].encode("utf-8", "surrogatepass")
                        for i in range(n))


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
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, blocks: Sequence[int]) -> int:
        """How many of `blocks`, from the first, are held: the expected hit in blocks."""
        held = self._blocks
        n = 0
        for h in blocks:
            if h not in held:
                break
            n += 1
        return n

    def add(self, blocks: Sequence[int]) -> None:
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
