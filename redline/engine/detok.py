"""Incremental detokenization with stop strings.

Tokens arrive one at a time; their bytes may split a UTF-8 character, and the text
may run into a stop string across tokens. `Detokenizer.feed` returns only text that
is final: no partial character, nothing that could still turn out to be a stop.
"""

from __future__ import annotations

import codecs


class Detokenizer:
    def __init__(self, stop: tuple[str, ...] = (), include_stop: bool = False) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._include = include_stop  # vLLM's include_stop_str_in_output
        self._held = ""  # text that might be the start of a stop string
        self.stopped = False

    def feed(self, piece: bytes, check: bool = True) -> str:
        """Add one token's bytes; returns the text that can be released now. With `check`
        False (vLLM's min_tokens not reached yet) no stop string ends it: the text goes out."""
        if self.stopped:
            return ""
        text = self._held + self._decoder.decode(piece)
        if not self._stop or not check:
            self._held = ""
            return text
        found = [(i, -len(s)) for s in self._stop if (i := text.find(s)) >= 0]
        if found:
            cut, minus = min(found)  # the earliest; of those starting there, the longest
            self.stopped = True
            self._held = ""
            return text[:cut - minus] if self._include else text[:cut]
        keep = self._longest_stop_prefix_suffix(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """At the end of generation: release what was held back (it was no stop)."""
        if self.stopped:
            return ""
        text = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return text

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        best = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best
