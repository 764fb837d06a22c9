"""Speed of a variant: prefill and decode tokens per second on one stream (the latency
one user sees), the best of a few runs after one unmeasured run. Best, not median: on a
shared machine other work only ever slows a run down, so the fastest run is the one
closest to what the variant itself costs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redline.optimize.runner import ModelRunner


@dataclass(frozen=True)
class Speed:
    prefill_tok_s: float
    decode_tok_s: float

    def request_s(self, n_prompt: int = 256, n_out: int = 64) -> float:
        """Seconds for a typical interactive request: the figure variants are ranked by."""
        return n_prompt / self.prefill_tok_s + n_out / self.decode_tok_s


def measure_speed(runner: ModelRunner, ids: Sequence[int], n_prefill: int = 256, n_decode: int = 48,
                  repeats: int = 5) -> Speed:
    prompt = list(ids[:n_prefill])
    runner.timed_generate(prompt[:32], 4)  # warm: first-call allocations, page faults
    prefill, decode = [], []
    for _ in range(repeats):
        p, d = runner.timed_generate(prompt, n_decode)
        prefill.append(len(prompt) / p)
        decode.append(n_decode / d)
    return Speed(max(prefill), max(decode))
