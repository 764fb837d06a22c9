"""Is a semantic hit wrong? The judge compares the answer the cache served with the
answer the model gives to the question that was actually asked (the same model, the same
sampling: what the user would have got without the cache).

    wrong(served, fresh, embedder, agreement) → bool

Why this is a fair judge of "wrong hit": for a greedy request the model's answer to the
cached question *is* the cached answer, so when the two questions mean the same the two
answers differ only where the model is sensitive to wording. The answers agree when
- they are the same text up to case, spacing and punctuation, or
- they state the same facts the guard compares in questions (numbers, times, units), and
- their embeddings are at least `agreement` similar (meaning, not wording).
It errs towards "wrong": an answer that is right but worded very differently counts as a
wrong hit, which only makes the cache more careful (the budget tightens), never serves
more wrong answers. For sampled requests (`cache_sampled`) the fresh answer is one draw,
and the judge is as noisy as the sampling.
"""

from __future__ import annotations

import re

import numpy as np

from redline.cache import guard
from redline.cache.embedder import Embedder

_PUNCT = re.compile(r"[^\w\s]+")


def _plain(text: str) -> str:
    return " ".join(_PUNCT.sub(" ", text.casefold()).split())


def facts(text: str) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    f = guard.features(text)
    return f.numbers, f.times, f.units


def wrong(served: str, fresh: str, embedder: Embedder, agreement: float) -> bool:
    if _plain(served) == _plain(fresh):
        return False
    if facts(served) != facts(fresh):
        return True
    rows = np.asarray(embedder.encode([served, fresh]), dtype=np.float32)  # [2, dim], unit rows
    return float(rows[0] @ rows[1]) < agreement
