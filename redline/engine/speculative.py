"""Speculative decoding without a draft model: n-gram prompt lookup.

An answer that quotes its prompt (an extraction, a summary, a code edit) repeats runs of
tokens the sequence already holds. For a decoding sequence we look up its last n tokens
(n from `max_match` down to `min_match`) earlier in prompt + output and propose the
tokens that followed there (`max_draft` at most), as vLLM's `ngram` method and
llama.cpp's lookup decoding do. The scheduler feeds the last token and the draft in one
batch of the target model, with logits at each; the engine then samples at each position
and keeps draft tokens while the target's own choice equals them, plus the target's
token at the first mismatch (or after the last draft token): every step emits at least
the token a plain step would. The rejected positions leave the KV cache before the next
step.

Every sequence may draft, greedy or sampled, with a grammar, penalties, logit bias or
logprobs. The engine samples position i with the sequence's own sampler (its chain, seed
and grammar state), from the target's logits after draft[:i]; it keeps going while the
token drawn equals the draft, and emits the first token that differs. Each emitted token
is therefore a draw from the target's distribution given the tokens before it, exactly as
in a plain decode: drafting changes speed, never the distribution. This is speculative
sampling's rule for a draft that puts all its mass on one token (accept with probability
p(d), else draw from the rest of p renormalised): drawing t ~ p and accepting when t = d
is that rule. The sampler takes one draw and one `accept` per emitted token, as without
drafts, so a seeded request gives the same text token for token, and penalties and the
grammar see exactly the emitted tokens (within llama.cpp's CPU kernels, which are not
batch-invariant: a near-tie may flip late as it may between a batch of one and of
eight).

The lookup is an index, not a scan: each sequence keeps a dict from every n-gram
(min_match ≤ n ≤ max_match) to the position where its latest occurrence ended, updated
with each new token, so a proposal costs a few dict lookups, whatever the context length.

Verifying is not free on a CPU: each draft token adds a share of a decode step (measured
here, 25-40 % on SmolLM2 with 2 threads), so a rejected draft slows the stream down. The
draft length adapts per sequence, as Hugging Face's assisted generation does: two more
after a draft that was accepted whole, one fewer after a rejection (at least one).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NgramSettings:
    max_draft: int = 4  # draft tokens proposed per step, at most
    min_match: int = 2  # shortest suffix looked up
    max_match: int = 4  # longest suffix looked up (longer matches are tried first)
    # draft only while at most this many sequences decode: with more, the batch is busy
    # and verifying drafts costs compute the other streams need
    max_decoding: int = 2


class Drafter:
    """A sequence's source of drafts, whose length adapts (see above)."""

    def __init__(self, settings: NgramSettings) -> None:
        self.s = settings
        self.length = settings.max_draft  # the next draft's length, at most

    def verified(self, proposed: int, accepted: int) -> None:
        """A draft of `proposed` tokens had its first `accepted` taken: adapt the length."""
        if proposed == 0:
            return
        if accepted == proposed:
            self.length = min(self.s.max_draft, self.length + 2)
        else:
            self.length = max(1, self.length - 1)

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        """Up to `limit` tokens likely to follow `tokens` (the sequence's prompt + output)."""
        raise NotImplementedError


class NgramIndex(Drafter):
    """Where each n-gram of one sequence's tokens last ended, to propose what followed."""

    def __init__(self, settings: NgramSettings) -> None:
        super().__init__(settings)
        self.last_end: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # n-grams ending before this position are in `last_end`

    def _extend(self, tokens: list[int]) -> None:
        # n-grams ending at the last position stay out: a lookup of the suffix must find
        # an earlier occurrence, never itself
        lo, hi = self.s.min_match, self.s.max_match
        for end in range(self.indexed, len(tokens) - 1):
            for n in range(lo, min(hi, end + 1) + 1):
                self.last_end[tuple(tokens[end - n + 1: end + 1])] = end
        self.indexed = max(self.indexed, len(tokens) - 1)

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        """Up to `limit` tokens likely to follow `tokens` (the sequence's prompt + output),
        or none when no suffix of it occurred before."""
        limit = min(limit, self.length)
        if limit <= 0:
            return []
        self._extend(tokens)
        for n in range(min(self.s.max_match, len(tokens)), self.s.min_match - 1, -1):
            end = self.last_end.get(tuple(tokens[-n:]))
            if end is not None:
                return tokens[end + 1: end + 1 + limit]
        return []


# OpenAI's Predicted Outputs: the client's guess at the answer is a draft source of its own.
# A guess that is mostly right (a code edit: the code as it was) keeps drafts long; the
# batch rule is the n-gram drafter's (none while more than two sequences decode)
PREDICTED = NgramSettings(max_draft=8, min_match=2, max_match=4, max_decoding=2)


class Prediction(Drafter):
    """Drafts from a predicted answer (`prediction` in chat completions). While the answer
    so far is the prediction's beginning, the draft is what comes next in it; once they
    part, the answer's last n tokens are looked up in the prediction (the first place at
    or after where the last draft came from, else the first anywhere) and what followed
    them there is the draft, so an edit in the middle picks the prediction up again after
    it. Drafts only change speed: the engine keeps a drafted token only where the model
    chose it too (see above). `start`: where the answer begins in the sequence's tokens
    (its prompt's length)."""

    def __init__(self, tokens: list[int], start: int,
                 settings: NgramSettings | None = None) -> None:
        settings = settings or PREDICTED
        super().__init__(settings)
        self.tokens = tokens
        self.start = start
        self.aligned = 0  # the answer's first `aligned` tokens are the prediction's; -1: parted
        self.cursor = 0  # where in the prediction the last draft came from
        self.proposed = 0  # draft tokens proposed in all (usage: prediction tokens)
        self.accepted = 0  # of those, the ones the model chose too
        self.ends: dict[tuple[int, ...], list[int]] = {}
        for n in range(settings.min_match, settings.max_match + 1):
            for end in range(n - 1, len(tokens)):
                self.ends.setdefault(tuple(tokens[end - n + 1: end + 1]), []).append(end)

    def verified(self, proposed: int, accepted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted
        super().verified(proposed, accepted)

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        limit = min(limit, self.length)
        if limit <= 0:
            return []
        output = tokens[self.start:]  # the answer so far
        if self.aligned >= 0:
            n = len(output)
            if n <= len(self.tokens) and output[self.aligned:] == self.tokens[self.aligned:n]:
                self.aligned = self.cursor = n
                return self.tokens[n: n + limit]
            self.aligned = -1
        for n in range(min(self.s.max_match, len(output)), self.s.min_match - 1, -1):
            ends = self.ends.get(tuple(output[-n:]))
            if ends:
                end = next((e for e in ends if e >= self.cursor), ends[0])
                self.cursor = end + 1
                return self.tokens[end + 1: end + 1 + limit]
        return []
