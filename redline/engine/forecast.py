"""When would a request arriving now get its first token? The engine's own forecast,
from the work it has already admitted, for the planner (routing/estimates.py).

    wait for a slot  +  prompt tokens ahead and its own × a prompt token's cost
                     +  the steps those take × a decode step's cost

A learned fit over "requests in flight" (what a remote engine gets) misses the knee:
with free slots a newcomer starts at once however many stream, and once the slots are
full it waits for the soonest of them to finish, which can be seconds. Here the engine
knows its slots, the prompts waiting ahead (by its order of service: a tier-S request
passes waiting A and B work) and how far each running answer has come.

A prompt computed with nothing decoding beside it runs in prompt-only steps, whose cost
is learnt as a fixed part plus a part per token (`prefill_s`, fitted on every such step,
short ones included): a prompt token's cost beside decoding streams (the prefill budget's
`token_s`) is several times that on a CPU, and a 20-token question after a cached system
prompt is mostly the fixed part. The engine passes only the tokens it will compute: a
prefix it holds (a slot's cells, the host cache) costs a copy, not a prefill.

Times are the engine's alone (measured inside its step turns); the planner multiplies
in what sharing the cores with other local engines costs now.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from redline.engine.budget import PrefillBudget
from redline.engine.prefix import common_prefix
from redline.engine.sequence import TIER_RANK, Sequence

ALPHA = 0.1  # weight of the newest finished answer in the length average
FORGET = 0.98  # per decode step, in the fit of a step's time against its batch


class Forecast:
    def __init__(self, n_slots: int, budget: PrefillBudget, expected_len: float = 64.0) -> None:
        self.n_slots = n_slots
        self.budget = budget
        self.expected_len = expected_len  # answer length, tokens (an average, learnt)
        # forgetting least squares of a decode-only step's seconds against its streams:
        # a model whose batch grows from 1 to 5 streams decodes each of them slower, and
        # the newcomer is one more
        self._s = [0.0, 0.0, 0.0, 0.0, 0.0]  # Σw, Σw·n, Σw·n², Σw·t, Σw·n·t
        # the same for a prompt-only step's seconds against its prompt tokens
        self._p = [0.0, 0.0, 0.0, 0.0, 0.0]
        # a held-back prompt computed on the side (engine/side.py): this many times its
        # prompt-only time (all threads over the side's), from this many tokens; None: no side
        self.side_factor: float | None = None
        self.side_min = 0

    def forget(self) -> None:
        """Drop the step fits (the answer length stays: it is the traffic's, not the
        machine's)."""
        self._s = [0.0] * 5
        self._p = [0.0] * 5

    def finished(self, n_output: int) -> None:
        self.expected_len += ALPHA * (n_output - self.expected_len)

    def observe_step(self, decoding: int, prompt: int, seconds: float) -> None:
        """A step ran; decode-only ones teach what a step of `decoding` streams costs,
        prompt-only ones what a step of `prompt` tokens costs."""
        if decoding and not prompt:
            _learn(self._s, decoding, seconds)
        elif prompt and not decoding:
            _learn(self._p, prompt, seconds)

    def step_s(self, streams: int) -> float | None:
        """A decode step's seconds with `streams` decoding (alone on the cores): the fit
        when it has seen more than one batch size, else the plain average."""
        if self._s[0] <= 0:
            return self.budget.decode_s
        return _fit(self._s, streams)

    def prefill_s(self, tokens: int) -> float | None:
        """Seconds to compute `tokens` prompt tokens with nothing decoding: chunks of
        `n_batch`, each a prompt-only step (None until two sizes of step are seen)."""
        if not _has_slope(self._p):
            return None
        full, rest = divmod(max(1, tokens), self.budget.n_batch)
        return full * _fit(self._p, self.budget.n_batch) + (_fit(self._p, rest) if rest else 0.0)

    def remaining(self, seq: Sequence) -> int:
        """Decode steps `seq` still takes, expected: its share of the average answer, or
        half again what it has written once it outlived the average (bounded by its cap)."""
        done = len(seq.output)
        cap = seq.sampling.max_tokens - done
        expect = self.expected_len - done
        if expect < 1:
            expect = max(1.0, min(self.expected_len, done) / 2)
        return max(1, min(cap, math.ceil(expect)))

    def tpot_s(self, running: int) -> float | None:
        """Each stream's TPOT once a newcomer joins the `running` streams (alone on the
        cores)."""
        return self.step_s(running + 1)

    def ttft_s(self, prompt_tokens: int, tier: str | None, running: Iterable[Sequence],
               waiting: Iterable[Sequence], tiers: bool = True,
               tokens: list[int] | None = None, side: bool = False) -> float | None:
        """Seconds to the first token of a new request with `prompt_tokens` to compute
        (its `tokens`, when known, find what it shares with work ahead of it); None until
        the step costs are measured (the planner then uses its learnt fit). `side`: a
        prompt held back goes to the side (engine/side.py), after the prompts ahead of it
        (the one there now counted whole)."""
        decode_s, token_s = self.budget.decode_s, self.budget.token_s
        if decode_s is None or token_s is None:
            return None
        rank = TIER_RANK.get(tier or "A", 1) if tiers else 2
        # unread streams give way to anyone (their slots, and their decode steps while a
        # read prompt runs); with tiers off all waiting work is ahead
        running = [s for s in running if not s.cancelled and not s.unread]
        queued = [s for s in waiting if not s.cancelled and not s.unread]
        ahead = [s for s in queued if not tiers or TIER_RANK.get(s.tier, 1) <= rank]
        prompt = _prompt_work(running + ahead, prompt_tokens, tokens)
        step = self.step_s(max(1, len(running))) or decode_s
        free = self.n_slots - len(running)
        if tiers and rank == 0:  # a tier-S request takes a tier-B answer's slot
            free += sum(1 for s in running if s.tier == "B")
        wait = 0.0
        if len(ahead) >= free:
            # it starts when the (behind)-th running answer finishes, soonest first
            behind = len(ahead) - free
            ends = sorted(self.remaining(s) for s in running)
            if ends:
                # answers admitted ahead of it take the slots that free first
                wait = ends[min(behind, len(ends) - 1)] * step
                rounds = behind // max(1, len(ends))
                wait += rounds * self.expected_len * step
        if not running and (alone := self.prefill_s(prompt)) is not None:
            return wait + alone  # prompt-only steps: nothing decodes beside them
        decoding = min(self.n_slots, len(running))
        per_step = max(1, self.budget.tokens(decoding))
        # long prompts in their slots and requests queued for a slot wait for a first
        # token with the newcomer: with any, it does not wait alone (budget.py
        # `yield_to_waiting`)
        long = pending = 0
        if self.budget.yield_to_waiting:
            long = sum(1 for s in running
                       if s.in_prefill and not self.budget.whole(s.prefill_to - s.n_fed))
            pending = long + len(queued) + 1
        if self.budget.yields(decoding - long, pending) and not self.budget.whole(prompt):
            per_step = self.budget.n_batch - decoding  # a long prompt takes the rest
        elif side and self.side_factor and decoding and prompt >= self.side_min \
                and not self.budget.whole(prompt) and (alone := self.prefill_s(prompt)):
            return wait + alone * self.side_factor + step  # on the side, then its last token
        steps = max(1, math.ceil(prompt / per_step))
        return wait + prompt * token_s + steps * step


RECENT_CONTEXTS = 4  # distinct prompts a prompt ahead is compared with (cost stays linear)


def _prompt_work(seqs: list[Sequence], own: int, tokens: list[int] | None) -> int:
    """Prompt tokens still to compute, by `seqs` in their order and then the newcomer
    (`own` tokens, its `tokens` if known). One that shares a prefix with a prompt before
    it (a system prompt that several users send at once) computes only the rest: it
    waits for those cells and copies them (scheduler.py)."""
    total = 0
    seen: list[list[int]] = []
    for s in seqs:
        context = s.context()
        left = s.prefill_to - s.n_fed
        if left > 0:
            shared = max((common_prefix(c, context) for c in seen), default=0)
            total += max(0, s.prefill_to - max(s.n_fed, shared))
        if not seen or common_prefix(seen[-1], context) < len(context):
            seen.append(context)
            del seen[:-RECENT_CONTEXTS]
    if tokens is not None and seen:
        shared = max(common_prefix(c, tokens) for c in seen)
        own = min(own, max(1, len(tokens) - shared))
    return total + own


def _learn(s: list[float], n: int, seconds: float) -> None:
    """Add (n, seconds) to a forgetting least-squares fit's sums (Σw, Σw·n, Σw·n², Σw·t,
    Σw·n·t)."""
    x = float(n)
    for i, v in enumerate((1.0, x, x * x, seconds, x * seconds)):
        s[i] = FORGET * s[i] + v


def _has_slope(s: list[float]) -> bool:
    """The fit has seen more than one size (a slope to learn)."""
    w, sn, snn = s[:3]
    return w > 0 and w * snn - sn * sn > 1e-9 * w * w


def _fit(s: list[float], n: int) -> float:
    """The fit's seconds at `n` (the plain average while it has seen one `n` only)."""
    w, sn, snn, st, snt = s
    if not _has_slope(s):
        return st / w
    det = w * snn - sn * sn
    slope = max(0.0, (w * snt - sn * st) / det)
    base = (st - slope * sn) / w
    return max(1e-4, base + slope * n)
