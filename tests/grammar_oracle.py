"""llama.cpp's own grammar engine as an oracle: whether a GBNF grammar takes a text, fed
as SmolLM2's tokens (then the end of text); the vocabulary is conftest's `smol_vocab`."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable

import llama_cpp as ll

from redline.engine.llama import LlamaModel
from redline.engine.sampling import grammar_sampler


def grammar_takes(vocab: tuple[LlamaModel, int], gbnf: str) -> Callable[[str], bool]:
    """Whether llama.cpp's grammar takes a text fed as the model's tokens, then the end."""
    model, end = vocab
    smpl = grammar_sampler(model.vocab, gbnf)
    one = (ll.llama_token_data * 1)()

    def allowed(t: int) -> bool:
        one[0].id, one[0].logit, one[0].p = t, 1.0, 0.0
        ll.llama_sampler_apply(smpl, ctypes.byref(ll.llama_token_data_array(
            data=one, size=1, selected=-1, sorted=False)))
        return math.isfinite(one[0].logit)

    def takes(text: str) -> bool:
        ll.llama_sampler_reset(smpl)
        for t in model.tokenize(text, add_special=False, parse_special=False):
            if not allowed(t):
                return False
            ll.llama_sampler_accept(smpl, t)
        return allowed(end)

    takes.free = lambda: ll.llama_sampler_free(smpl)  # type: ignore[attr-defined]
    return takes


