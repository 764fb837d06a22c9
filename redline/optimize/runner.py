"""What the ladder needs from a model it measures, whatever runs it (llama.cpp, torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class TokenScores:
    """Teacher-forced scores over held-out text: for each predicted token, its negative
    log-likelihood and the token the model would have chosen greedily."""

    nll: np.ndarray  # [n] float64, nats
    top1: np.ndarray  # [n] int64

    @staticmethod
    def concat(parts: list[TokenScores]) -> TokenScores:
        return TokenScores(np.concatenate([p.nll for p in parts]),
                           np.concatenate([p.top1 for p in parts]))


class ModelRunner(Protocol):
    def tokenize(self, text: str) -> list[int]:
        """Token ids without BOS (the runner adds it where the model wants one)."""
        ...

    def score(self, window: list[int]) -> TokenScores:
        """Scores for predicting window[1:], each from the tokens before it in the window."""
        ...

    def answer(self, questions: list[str], max_tokens: int) -> list[str]:
        """Greedy answer to each question (in the model's chat template if it has one, else
        as `Question: …\nAnswer:`), up to the first newline or `max_tokens`."""
        ...

    def timed_generate(self, ids: list[int], n_new: int) -> tuple[float, float]:
        """Prefill `ids` in one pass, then decode `n_new` tokens one by one, greedy, from a
        fresh context; returns (prefill seconds, decode seconds)."""
        ...

    def memory_bytes(self) -> int:
        """Bytes the weights take in memory."""
        ...

    def close(self) -> None: ...


def logsumexp_rows(logits: np.ndarray) -> np.ndarray:
    """[n, vocab] → [n], in float64 so long vocabularies do not lose precision."""
    x = logits.astype(np.float64, copy=False)
    m = x.max(axis=-1, keepdims=True)
    out: np.ndarray = (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))[..., 0]
    return out
