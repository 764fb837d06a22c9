"""One request inside the engine: its tokens, its slot, its clock."""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from redline.engine.detok import Detokenizer
from redline.engine.sampling import Sampler
from redline.types import Chunk, SamplingParams


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
    arrival: float = field(default_factory=time.perf_counter)
    state: SeqState = SeqState.WAITING
    slot: int | None = None
    n_fed: int = 0  # prompt+output tokens whose KV is computed
    reused: int = 0  # prompt tokens taken from the prefix cache
    output: list[int] = field(default_factory=list)
    scheduled_at: float | None = None
    first_token_at: float | None = None
    detok_s: float = 0.0
    _cancel: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.detok = Detokenizer(self.sampling.stop)
        self.sampler = Sampler(self.sampling)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def in_prefill(self) -> bool:
        return self.n_fed < len(self.prompt)

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Thread-safe: the scheduler frees the slot before its next step."""
        self._cancel.set()
