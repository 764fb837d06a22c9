"""Per-sequence token choice: greedy by argmax, or a llama.cpp sampler chain."""

from __future__ import annotations

import random

import llama_cpp as ll
import numpy as np

from redline.types import SamplingParams


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
