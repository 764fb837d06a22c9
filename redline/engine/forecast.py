"""When would a request arriving now get its first token? The engine's own forecast,
from the work it has already admitted, for the planner (routing/estimates.py).

    wait for a slot  +  prompt tokens ahead and its own × a prompt token's cost
                     +  the steps those take × a decode step's cost

A learned fit over "requests in flight" (what a remote engine gets) misses the knee:
with free slots a newcomer starts at once however many stream, and once the slots are
full it waits for the soonest of them to finish, which can be seconds. Here the engine
knows its slots, the prompts waiting ahead (by its order of service: a tier-S request
passes waiting A and B work) and how far each running answer has come.

Times are the engine's alone (measured inside its step turns); the planner multiplies
in what sharing the cores with other local engines costs now.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from redline.engine.budget import PrefillBudget
from redline.engine.sequence import TIER_RANK, Sequence

ALPHA = 0.1  # weight of the newest finished answer in the length average


class Forecast:
    def __init__(self, n_slots: int, budget: PrefillBudget, expected_len: float = 64.0) -> None:
        self.n_slots = n_slots
        self.budget = budget
        self.expected_len = expected_len  # answer length, tokens (an average, learnt)

    def finished(self, n_output: int) -> None:
        self.expected_len += ALPHA * (n_output - self.expected_len)

    def remaining(self, seq: Sequence) -> int:
        """Decode steps `seq` still takes, expected: its share of the average answer, or
        half again what it has written once it outlived the average (bounded by its cap)."""
        done = len(seq.output)
        cap = seq.sampling.max_tokens - done
        expect = self.expected_len - done
        if expect < 1:
            expect = max(1.0, min(self.expected_len, done) / 2)
        return max(1, min(cap, math.ceil(expect)))

    def tpot_s(self) -> float | None:
        """A decode step's seconds now (what each stream's TPOT is, alone on the cores)."""
        return self.budget.decode_s

    def ttft_s(self, prompt_tokens: int, tier: str | None, running: Iterable[Sequence],
               waiting: Iterable[Sequence], tiers: bool = True) -> float | None:
        """Seconds to the first token of a new request; None until the step costs are
        measured (the planner then uses its learnt fit)."""
        decode_s, token_s = self.budget.decode_s, self.budget.token_s
        if decode_s is None or token_s is None:
            return None
        rank = TIER_RANK.get(tier or "A", 1) if tiers else 2
        running = [s for s in running if not s.cancelled]
        # unread streams give way to anyone; with tiers off all waiting work is ahead
        ahead = [s for s in waiting if not s.cancelled and not s.unread
                 and (not tiers or TIER_RANK.get(s.tier, 1) <= rank)]
        prompt = prompt_tokens + sum(max(0, s.prefill_to - s.n_fed) for s in running + ahead)
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
                wait = ends[min(behind, len(ends) - 1)] * decode_s
                rounds = behind // max(1, len(ends))
                wait += rounds * self.expected_len * decode_s
        decoding = min(self.n_slots, len(running))
        per_step = max(1, self.budget.tokens(decoding))
        steps = max(1, math.ceil(prompt / per_step))
        return wait + prompt * token_s + steps * decode_s
