"""One optimisation run: measure the reference, then each candidate against it, refuse
those the gate fails, and write out the fastest that passes: the one that would serve a
typical interactive request (256 prompt tokens, 64 out, one stream) soonest."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from redline.optimize.evalset import EvalSet
from redline.optimize.gate import Gate
from redline.optimize.quality import Quality, measure
from redline.optimize.runner import ModelRunner, TokenScores
from redline.optimize.speed import Speed, measure_speed

log = logging.getLogger(__name__)


class Candidate(Protocol):
    name: str  # e.g. Q8_0, bf16
    kind: str  # what the weights are, e.g. MOSTLY_Q8_0, torch.bfloat16

    def open(self) -> ModelRunner:
        """Build the variant if needed and load it for measuring."""
        ...

    def file_bytes(self) -> int: ...

    def write(self, out_dir: Path) -> Path:
        """Keep the variant: write it under `out_dir` and return its path."""
        ...

    def discard(self) -> None:
        """Remove what `open` built (the reference keeps its file)."""
        ...


@dataclass
class Result:
    name: str
    kind: str
    reference: bool
    file_bytes: int
    memory_bytes: int
    speed: Speed
    quality: Quality
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0  # to build and measure it

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass
class Report:
    model: str
    source: str
    gate: Gate
    results: list[Result]
    chosen: str | None
    output: str | None
    notes: list[str]
    tokens_scored: int
    questions: int
    seconds: float


def _measure(c: Candidate, ids: list[int] | None, ev: EvalSet,
             ref: tuple[TokenScores, list[str]] | None,
             step: str = "") -> tuple[Result, TokenScores, list[int]]:
    """`step`: "[i/n]" for the progress lines (each variant takes minutes)."""
    t0 = time.perf_counter()
    log.info("%s %s: building and loading", step, c.name)
    runner = c.open()
    try:
        t1 = time.perf_counter()
        ids = ids if ids is not None else runner.tokenize(ev.heldout)
        log.info("%s %s: quality (%d held-out tokens, %d questions)", step, c.name, len(ids),
                 len(ev.questions))
        quality, scores = measure(runner, ids, ev, ref)
        t2 = time.perf_counter()
        log.info("%s %s: speed", step, c.name)
        speed = measure_speed(runner, ids)
        memory = runner.memory_bytes()
    finally:
        runner.close()
    log.debug("%s: build+load %.1f s, quality %.1f s, speed %.1f s", c.name, t1 - t0, t2 - t1,
              time.perf_counter() - t2)
    result = Result(c.name, c.kind, ref is None, c.file_bytes(), memory, speed, quality)
    result.seconds = time.perf_counter() - t0
    return result, scores, ids


def run_ladder(model: str, reference: Candidate, candidates: list[Candidate], ev: EvalSet,
               gate: Gate, out_dir: Path, notes: list[str] | None = None,
               source: str = "") -> Report:
    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    n = len(candidates) + 1
    ref_result, ref_scores, ids = _measure(reference, None, ev, None, f"[1/{n}]")
    log.info("reference %s: ppl %.3f, decode %.1f tok/s", reference.name,
             ref_result.quality.perplexity, ref_result.speed.decode_tok_s)
    results = [ref_result]
    kept: dict[str, Candidate] = {reference.name: reference}
    for i, c in enumerate(candidates, start=2):
        try:
            r, _, _ = _measure(c, ids, ev, (ref_scores, ref_result.quality.answers),
                               f"[{i}/{n}]")
        except Exception:
            c.discard()
            raise
        r.failures = gate.failures(ref_result.quality, r.quality)
        log.info("%s: ppl %.3f, decode %.1f tok/s, %s", c.name, r.quality.perplexity,
                 r.speed.decode_tok_s, "pass" if r.passed else "; ".join(r.failures))
        results.append(r)
        kept[c.name] = c
    passing = [r for r in results if r.passed]
    best = min(passing, key=lambda r: r.speed.request_s())  # the reference always passes
    output = None if best.reference else str(kept[best.name].write(out_dir))
    for name, c in kept.items():
        if name != reference.name:
            c.discard()
    return Report(model, source, gate, results, best.name, output, list(notes or []),
                  ref_result.quality.tokens_scored, len(ev.questions), time.perf_counter() - t0)
