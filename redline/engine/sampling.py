"""Per-sequence token choice: greedy by argmax, or a llama.cpp sampler chain.

The chain, in order: `logit_bias`, vLLM's repetition penalty (over the prompt and the
output: a positive logit divided by it, a negative one multiplied), the presence/frequency
penalties (OpenAI's formula: logit -= count * frequency + (count > 0) * presence, over
this sequence's own output), then greedy, or top-k, top-p, temperature, vLLM's min-p (on
the tempered distribution, as vLLM applies it) and a seeded draw.

A grammar (structured outputs, forced tool calls) is checked after the draw, as llama.cpp's
own common sampler does: checking a 49k-token vocabulary against the grammar at every step
is slow, so the free chain picks a token first and only that token is checked; when the
grammar refuses it, the step samples again from the grammar-filtered vocabulary.

A lazy grammar (`grammar_trigger`, as `tool_choice: auto` sets it) constrains nothing until
the answer so far matches the trigger (a regular expression, searched near the answer's
end); then the grammar is fed the answer from the trigger's first group on, and
constrains every later token. llama.cpp's own lazy grammar is not used: it feeds the
grammar the whole token that completes the trigger, and throws (aborting the process)
when the rest of that token does not fit; here such a start is checked first, and a
trigger whose text the grammar does not take leaves the answer unconstrained."""

from __future__ import annotations

import ctypes
import math
import random
import re
from collections.abc import Callable
from typing import Any

import llama_cpp as ll
import numpy as np

from redline.engine.llama import token_piece, tokenize
from redline.types import SamplingParams, TokenLogprob, TopLogprob

# llama_token_data: {id: int32, logit: float, p: float}
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class GrammarError(ValueError):
    """llama.cpp could not parse a grammar (the backend compiles it once before submitting)."""


def grammar_sampler(vocab: Any, grammar: str) -> Any:
    smpl = ll.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not smpl:
        raise GrammarError("llama.cpp refused the grammar")
    return smpl


def check_grammar(vocab: Any, grammar: str) -> None:
    """GrammarError unless llama.cpp compiles `grammar` over `vocab`."""
    ll.llama_sampler_free(grammar_sampler(vocab, grammar))


class Sampler:
    def __init__(self, params: SamplingParams, prompt: list[int] | None = None) -> None:
        self.params = params
        self.prompt = prompt or []  # what the repetition penalty counts besides the output
        self.penalised = bool(params.presence_penalty or params.frequency_penalty)
        self.repeats = params.repetition_penalty not in (None, 1.0)
        # argmax alone: nothing edits the logits before the choice
        self.greedy = (params.greedy and not params.logit_bias and not self.penalised
                       and not self.repeats and params.grammar is None)
        self._chain: Any = None
        self._grammar: Any = None
        self._cands: np.ndarray | None = None
        self._one = np.zeros(1, dtype=_TOKEN_DATA)
        # a lazy grammar: the trigger, and the answer so far while it has not matched
        self._trigger = (re.compile(params.grammar_trigger.encode()) if params.grammar_trigger
                         else None)
        self._said = b""
        self._vocab: Any = None

    def _build(self, ctx: object) -> None:
        """The chain, built on first use (the vocabulary comes from the context)."""
        p = self.params
        vocab = ll.llama_model_get_vocab(ll.llama_get_model(ctx))
        n_vocab = ll.llama_vocab_n_tokens(vocab)
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        if p.logit_bias:
            biases = (ll.llama_logit_bias * len(p.logit_bias))()
            for i, (token, bias) in enumerate(p.logit_bias):
                biases[i].token = int(token)  # type: ignore[assignment]  # ctypes takes an int (stub: c_int32)
                # -100/100 ban or force a token, as OpenAI documents
                biases[i].bias = -math.inf if bias <= -100 else float(bias)
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_logit_bias(
                n_vocab, len(p.logit_bias), biases))
        if self.repeats:
            window = len(self.prompt) + max(p.max_tokens, 1)
            repeat = _penalties(window, float(p.repetition_penalty or 1.0), 0.0, 0.0)
            for seen in self.prompt:  # the prompt counts as if it had been generated
                ll.llama_sampler_accept(repeat, seen)
            ll.llama_sampler_chain_add(chain, repeat)
        if self.penalised:
            ll.llama_sampler_chain_add(chain, _penalties(
                max(p.max_tokens, 1), 1.0, float(p.frequency_penalty or 0.0),
                float(p.presence_penalty or 0.0)))
        if p.greedy:
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
        else:
            if p.top_k > 0:
                ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_k(p.top_k))
            if p.top_p < 1.0:
                ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_p(p.top_p, 1))
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_temp(p.temperature))
            if p.min_p:
                ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_min_p(p.min_p, 1))
            seed = p.seed if p.seed is not None else random.getrandbits(32)
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        self._chain = chain
        self._vocab = vocab
        if p.grammar is not None and self._trigger is None:
            self._grammar = grammar_sampler(vocab, p.grammar)
        if p.grammar is not None:
            self._cands = np.zeros(n_vocab, dtype=_TOKEN_DATA)

    def sample(self, ctx: object, index: int, logits: np.ndarray) -> int:
        """Choose the next token from batch entry `index` (logits: [n_vocab])."""
        if self.greedy:
            return int(logits.argmax())
        if self._chain is None:
            self._build(ctx)
        if self._grammar is None:
            token = int(ll.llama_sampler_sample(self._chain, ctx, index))
            if self._trigger is not None:
                self._watch(token)
            return token
        token = self._apply(logits, self._chain)
        if not self._allows(token):
            token = self._apply(logits, self._grammar, self._chain)
        ll.llama_sampler_accept(self._grammar, token)
        ll.llama_sampler_accept(self._chain, token)
        return token

    @property
    def constrained(self) -> bool:
        """Whether the grammar holds the tokens now (a lazy one: once triggered)."""
        return self._grammar is not None

    def _watch(self, token: int) -> None:
        """A lazy grammar's wait: when the answer so far matches the trigger, the grammar
        starts at its first group and takes the text from there; when that text does not
        fit it (a false start), the answer stays unconstrained."""
        assert self._trigger is not None and self.params.grammar is not None
        before = len(self._said)
        self._said += token_piece(self._vocab, token, special=True)
        window = max(0, before - 256)  # a trigger ends in the new piece: search near it
        found = self._trigger.search(self._said, window)
        if found is None:
            if len(self._said) > 4096:
                self._said = self._said[-512:]
            return
        self._trigger = None  # one try: the answer from here on is the call, or is text
        self._grammar = grammar_sampler(self._vocab, self.params.grammar)
        # any tokens spelling the text from the trigger on: the grammar reads text
        for t in tokenize(self._vocab, self._said[found.start(1):], False, True):
            if not self._allows(t):  # a false start
                ll.llama_sampler_free(self._grammar)
                self._grammar = None
                return
            ll.llama_sampler_accept(self._grammar, t)

    def _apply(self, logits: np.ndarray, *samplers: Any) -> int:
        """Run `samplers` over the whole vocabulary; the token they select."""
        cands = self._cands
        assert cands is not None
        cands["id"] = np.arange(len(cands), dtype=np.int32)
        cands["logit"] = logits
        cands["p"] = 0.0
        arr = _array(cands)
        for smpl in samplers:
            ll.llama_sampler_apply(smpl, ctypes.byref(arr))
        # a sampler may sort or move the data: read the selection through the array
        return int(arr.data[max(int(arr.selected), 0)].id)

    def _allows(self, token: int) -> bool:
        """Whether the grammar accepts `token` next (one token checked, not the vocabulary)."""
        self._one[0] = (token, 1.0, 0.0)
        arr = _array(self._one)
        ll.llama_sampler_apply(self._grammar, ctypes.byref(arr))
        return bool(np.isfinite(self._one["logit"][0]))

    def close(self) -> None:
        if self._chain is not None:
            ll.llama_sampler_free(self._chain)
            self._chain = None
        if self._grammar is not None:
            ll.llama_sampler_free(self._grammar)
            self._grammar = None


def _penalties(window: int, repeat: float, frequency: float, presence: float) -> Any:
    """llama.cpp's penalties sampler over the last `window` accepted tokens. The binding
    declares (n_vocab, last_n, ...) where the C function now takes (last_n, ...): the
    window goes in both places, right under either signature."""
    return ll.llama_sampler_init_penalties(window, window, repeat, frequency, presence)


def _array(cands: np.ndarray) -> Any:
    return ll.llama_token_data_array(
        data=cands.ctypes.data_as(ctypes.POINTER(ll.llama_token_data)), size=len(cands),
        selected=-1, sorted=False)


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
