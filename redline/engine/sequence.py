"""One request inside the engine: its tokens, its slot, its clock, its rank."""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redline.engine.detok import Detokenizer
from redline.engine.sampling import Sampler
from redline.engine.speculative import Drafter, NgramIndex, Prediction
from redline.types import Chunk, Presence, SamplingParams, TokenLogprob

TIER_RANK = {"S": 0, "A": 1, "B": 2}  # lower goes first


class SeqState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    id: str
    prompt: list[int]
    sampling: SamplingParams
    emit: Callable[[Chunk], None]  # called on `loop`'s thread
    loop: asyncio.AbstractEventLoop
    tier: str = "A"  # the latency tier it is served in: S before A before B
    # set by the streams layer while nobody reads the answer (kept for a resume): it yields
    presence: Presence | None = None
    arrival: float = field(default_factory=time.perf_counter)
    state: SeqState = SeqState.WAITING
    slot: int | None = None
    n_fed: int = 0  # prompt+output tokens whose KV is computed
    reused: int = 0  # prompt tokens taken from the prefix cache
    # prompt tokens the first placement took from the prefix cache (usage's cached_tokens;
    # a preemption's recomputation is redline's cost, not a saving the client sees)
    cached: int = 0
    output: list[int] = field(default_factory=list)
    # tokens to compute before decoding goes on: the prompt, or after a preemption the
    # prompt and every token generated so far (recomputed; the stream continues)
    prefill_to: int = -1
    preemptions: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    detok_s: float = 0.0
    lookup: NgramIndex | None = None  # its n-grams, once it drafts (speculative decoding)
    prediction: Prediction | None = None  # the client's predicted answer, drafted from
    # the prompt's own log-probabilities, scored as it is computed (SamplingParams.
    # prompt_logprobs): entry i is prompt token i + 1's
    prompt_lps: list[TokenLogprob] = field(default_factory=list)
    # the side job computing its prompt now (engine/side.py); the scheduler feeds it none
    aside: Any = None
    no_side: bool = False  # the side failed it once: its prompt runs in the engine's steps
    _cancel: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.detok = Detokenizer(self.sampling.stop, bool(self.sampling.include_stop_str_in_output))
        self.sampler = Sampler(self.sampling, self.prompt)
        if self.prefill_to < 0:
            self.prefill_to = len(self.prompt)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    def context(self) -> list[int]:
        """The tokens its KV must hold before it decodes on (its prefill's target)."""
        if self.prefill_to <= len(self.prompt):
            return self.prompt
        return (self.prompt + self.output)[: self.prefill_to]

    @property
    def seq_id(self) -> int:
        """Its slot, which is its llama.cpp sequence id: a running sequence has one."""
        if self.slot is None:
            raise RuntimeError(f"sequence {self.id} is not running: it has no slot")
        return self.slot

    @property
    def drafter(self) -> Drafter | None:
        """Where its drafts come from: the client's predicted answer, else its n-grams."""
        return self.prediction or self.lookup

    @property
    def scores_prompt(self) -> bool:
        """It scores its prompt, so every prompt token is computed here (none reused)."""
        return self.sampling.prompt_logprobs is not None

    def scored(self, pos: int) -> bool:
        """Whether the logits at prompt position `pos` give a log-probability it lacks."""
        return self.scores_prompt and len(self.prompt_lps) <= pos < len(self.prompt) - 1

    @property
    def in_prefill(self) -> bool:
        return self.n_fed < self.prefill_to

    @property
    def unread(self) -> bool:
        """Its client left and nobody reads it now: it gives way to anyone who waits."""
        return self.presence is not None and self.presence.gone

    def rank(self, tiers: bool) -> tuple[int, int, float]:
        """Order of service, lower first: read before unread, then (with `tiers`) S, A, B,
        then arrival (a preempted sequence keeps its place among its peers)."""
        return (int(self.unread), TIER_RANK.get(self.tier, 1) if tiers else 0, self.arrival)

    def preempted(self) -> None:
        """It gave its slot away: recompute prompt and output when it is back."""
        self.state = SeqState.WAITING
        self.slot = None
        self.n_fed = 0
        self.aside = None  # a prompt on the side is dropped with its slot
        self.prefill_to = len(self.prompt) + len(self.output)
        self.preemptions += 1

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Thread-safe: the scheduler frees the slot before its next step."""
        self._cancel.set()
