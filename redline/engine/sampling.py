"""Per-sequence token choice: greedy by argmax, or a llama.cpp sampler chain."""

from __future__ import annotations

import random
from collections.abc import Callable

import llama_cpp as ll
import numpy as np

from redline.types import SamplingParams, TokenLogprob, TopLogprob


class Sampler:
    def __init__(self, params: SamplingParams) -> None:
        self.greedy = params.greedy
        self._chain = None
        if self.greedy:
            return
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        if params.top_k > 0:
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_p(params.top_p, 1))
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_temp(params.temperature))
        seed = params.seed if params.seed is not None else random.getrandbits(32)
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        self._chain = chain

    def sample(self, ctx: object, index: int, logits: np.ndarray) -> int:
        """Choose the next token from batch entry `index` (logits: [n_vocab])."""
        if self._chain is None:
            return int(logits.argmax())
        return int(ll.llama_sampler_sample(self._chain, ctx, index))

    def close(self) -> None:
        if self._chain is not None:
            ll.llama_sampler_free(self._chain)
            self._chain = None


def token_logprobs(logits: np.ndarray, token: int, top: int,
                   piece: Callable[[int], bytes]) -> TokenLogprob:
    """The chosen token's log-probability and the `top` likeliest tokens' (logits:
    [n_vocab]): the model's raw distribution, a log-softmax of the logits before
    temperature, top-k and top-p (what vLLM returns by default)."""
    peak = float(logits.max())
    lse = peak + float(np.log(np.exp(logits - peak, dtype=np.float64).sum()))

    def entry(t: int) -> tuple[str, float, tuple[int, ...]]:
        raw = piece(t)
        return raw.decode("utf-8", "replace"), float(logits[t]) - lse, tuple(raw)

    tops: tuple[TopLogprob, ...] = ()
    if top > 0:
        best = np.argpartition(-logits, top)[:top]
        best = best[np.argsort(-logits[best], kind="stable")]
        tops = tuple(TopLogprob(*entry(int(t))) for t in best)
    return TokenLogprob(*entry(token), top=tops)
