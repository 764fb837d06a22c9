"""Per-arm samples, fed by the pipeline's observer hook when a completion ends.

In memory, per replica: the latest `max_samples` completions of each arm. A completion
is `completed` when it ended normally (status 200 and finish stop/length) and
`interrupted` when the client went away first (status 499)."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redline.types import Finished


@dataclass
class ArmRecord:
    max_samples: int
    ttft: deque[float] = field(init=False)
    tpot: deque[float] = field(init=False)
    e2e: deque[float] = field(init=False)
    outcomes: deque[str] = field(init=False)  # "completed" | "interrupted" | "error" | "other"
    cache_hits: int = 0

    def __post_init__(self) -> None:
        for name in ("ttft", "tpot", "e2e", "outcomes"):
            setattr(self, name, deque(maxlen=self.max_samples))

    def add(self, c: Finished) -> None:
        if c.status == "499":
            outcome = "interrupted"
        elif c.status != "200":
            outcome = "error"
        elif c.finish_reason in ("stop", "length"):
            outcome = "completed"
        else:
            outcome = "other"
        self.outcomes.append(outcome)
        if c.cache not in ("miss", "bypass"):
            self.cache_hits += 1
        if c.ttft_s is not None:
            self.ttft.append(c.ttft_s)
        if c.status == "200":  # latency of answers that finished, as the Prometheus histograms
            total = c.total_s
            if total is not None:
                self.e2e.append(total)
                if c.ttft_s is not None and c.output_tokens > 1:
                    self.tpot.append((total - c.ttft_s) / (c.output_tokens - 1))

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes if o == outcome)


class Recorder:
    """The pipeline Observer: routes each finished completion to its arm's record."""

    def __init__(self, max_samples: int) -> None:
        self.max_samples = max_samples
        self.arms: dict[str, ArmRecord] = {}
        self._lock = threading.Lock()  # on_finish may run on any task; snapshots on another

    def on_finish(self, completion: Finished) -> None:
        label = completion.arm
        if label is None:
            return
        with self._lock:
            rec = self.arms.get(label)
            if rec is None:
                rec = self.arms[label] = ArmRecord(self.max_samples)
            rec.add(completion)

    def copy(self, label: str) -> tuple[list[float], list[float], list[float], list[str], int]:
        with self._lock:
            rec = self.arms.get(label)
            if rec is None:
                return [], [], [], [], 0
            return list(rec.ttft), list(rec.tpot), list(rec.e2e), list(rec.outcomes), rec.cache_hits

    def reset(self) -> None:
        with self._lock:
            self.arms.clear()
