"""How many prompt tokens a step may carry while other streams decode.

A step's time grows with its tokens: one decode token per running stream, plus prompt
chunks. Filling the rest of `n_batch` with a newcomer's 1,500-token prompt makes the
running streams' next token wait for all of it (a stall several TPOTs long). So while
streams decode, a step carries only as many prompt tokens as fit in `slack` times a
decode-only step (what the streams' TPOT is): their inter-token latency stays within
(1 + slack)× their TPOT, and the prompt still advances every step. When nothing decodes
there is no one to stall: the whole batch is the prompt's.

A short prompt goes whole (`whole`): when all of it (what its cached prefix leaves)
adds at most `WHOLE_S` to a step, it runs in one. Chunked at the budget, a 43-token
question took 5-6 steps beside one decoding stream (a step carries ~8 prompt tokens
where each adds ~1 ms to a 12 ms step), so its first token came at 1.6x llama-server's,
which takes a prompt whole; the decoding streams instead see one step up to `WHOLE_S`
longer, once. A long prompt (the 1,500 tokens of the fairness figure: over a second of
work) is chunked as before, to its end, while at least `protect` streams decode (7 in the
fairness figure); beside fewer it takes the rest of the batch every step (`yields`), as
with a fixed budget: one stream decoding beside a 1,563-token prompt kept its ITL, and the
prompt's first token came at 2.1x llama-server's, which stalls the stream instead. Held
back for one or two streams, a long prompt costs its user more than it saves theirs.

And it is held back only while it waits alone (`yield_to_waiting`): with another long
prompt in its slot or a request queued for a slot, the users waiting for a first token go
first, one prompt at a time in whole batches, and the streams' tokens wait for the
chunks. Held back whenever enough streams decode, the prompts of 8 clients sending
1,563-token prompts waited on the streams and came at 1.9-2.3x llama-server's first
token; the streams end sooner, the clients send sooner, and in a closed loop the same
tok/s means a later first token for a smoother answer. Yielding, 0.88x (tok/s 1.12x), and
the streams' worst gap still under llama-server's (1.7 s against 4.4 s: its prompts take
2,048-token batches).

Both costs are measured, not configured: an average of decode-only steps' seconds, and
of the seconds each prompt token adds to a step (weights, threads and cores differ per
machine and model). Until both are known, a small first budget.
"""

from __future__ import annotations

import math

ALPHA = 0.2  # weight of the newest step in the running averages
FIRST = 64  # tokens per step before the costs are known
FLOOR = 8  # a prompt always advances (the default floor: `floor` per budget)
WHOLE_S = 0.1  # a prompt (its uncached part) with at most this much work runs in one step


def protected_streams(share: float, slots: int) -> int:
    """`PrefillBudget.protect` for `share` of `slots` (`models[].prefill_protect_share`):
    at least one stream."""
    return max(1, math.ceil(share * slots))


class PrefillBudget:
    def __init__(self, n_batch: int, slack: float | None = 0.5, floor: int = FLOOR,
                 protect: int = 1, yield_to_waiting: bool = False) -> None:
        self.n_batch = n_batch
        self.slack = slack  # None: fixed (the whole rest of the batch, every step)
        self.floor = floor  # prompt tokens a step carries at least
        self.protect = protect  # the fewest decoding streams a long prompt is held back for
        # and, with `yield_to_waiting`, only while it waits alone for its first token
        self.yield_to_waiting = yield_to_waiting
        self.decode_s: float | None = None  # a decode-only step
        self.token_s: float | None = None  # what one prompt token adds to a step

    def forget(self) -> None:
        """Measure both costs afresh (the first budget until they are known again)."""
        self.decode_s = self.token_s = None

    def tokens(self, decoding: int) -> int:
        """Prompt tokens for the next step, with `decoding` streams decoding in it."""
        room = self.n_batch - decoding
        if self.slack is None or decoding == 0:
            return room
        if self.decode_s is None or self.token_s is None:
            return max(0, min(room, FIRST))
        fit = int(self.slack * self.decode_s / max(self.token_s, 1e-9))
        return max(0, min(room, max(self.floor, fit)))

    def yields(self, decoding: int, pending: int = 0) -> bool:
        """With `decoding` streams decoding and `pending` users waiting for a first token
        (long prompts in their slots, the one asked about among them, and requests queued
        for a slot), a long prompt takes the rest of the batch: too few streams to hold it
        back for (`protect`), or, with `yield_to_waiting`, it does not wait alone (two or
        more users wait for a first token, or as many as decode)."""
        if self.slack is None:
            return False
        return decoding < self.protect \
            or (self.yield_to_waiting and pending >= min(2, decoding))

    def whole(self, left: int) -> bool:
        """A prompt with `left` tokens to compute may run in one step, past `tokens`."""
        return self.slack is not None and self.token_s is not None \
            and left * self.token_s <= WHOLE_S

    def observe(self, decoding: int, prompt: int, seconds: float) -> None:
        """A step ran: `decoding` decode tokens and `prompt` prompt tokens in `seconds`."""
        if prompt == 0:
            if decoding:
                self.decode_s = _avg(self.decode_s, seconds)
            return
        # a mixed step: what the prompt added beyond the decode-only step; a prompt-only
        # step: its fixed part is small next to a chunk's (slightly high: cautious)
        if decoding and self.decode_s is None:
            return  # cannot split it yet
        if not decoding and prompt < FIRST:
            return  # a short prompt's step is mostly the fixed part: it would mislead
        base = self.decode_s if decoding and self.decode_s is not None else 0.0
        self.token_s = _avg(self.token_s, max(0.0, seconds - base) / prompt)


def _avg(old: float | None, new: float) -> float:
    return new if old is None else old + ALPHA * (new - old)
