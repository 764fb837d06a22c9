"""A long prompt computed on the side, on some of the cores, while streams decode.

While streams decode, the prefill budget (engine/budget.py) feeds a long prompt a few
tokens a step so that their tokens keep coming. On a CPU that is slow work: a prompt
token in a small chunk costs 2-3x what it costs in a 512-token one, because llama.cpp's
flash attention computes fewer than 64 query rows one row at a time and the chunk
attends over all of the prompt before it (at position 1,400, 8 tokens add ~35 ms to a
23 ms decode step; 256 tokens cost 2.4 ms each). With 7 streams decoding, a
1,500-token prompt's first token came after ~12 s, and the streams' worst gap was still
3.5x their TPOT, because the budget's floor (8 tokens a step) outgrew its slack.

Here the cores are split instead of shared. The prompt runs in a context of its own, on
a thread of its own (`compute.side()`), with `side_threads` threads and whole `n_batch`
chunks; meanwhile the engine's steps run on the rest of the cores (`compute.reserve`:
its passes use fewer threads). When the prompt is done, its cells are copied into its
slot (`llama_state_seq_get/set_data`, ~7 ms and ~4 ms for 1,500 SmolLM2 tokens, in
buffers used again) and
its last token runs in the engine's next step, which gives its first token. On 2 cores
the streams decode on one (about 2x their TPOT, whatever the prompt's length) while the
prompt takes the other (bench/engine_prefill_itl.py measures both).

A job carries the cells its slot already holds (a cached prefix) along, and stops
between chunks when its sequence is cancelled; a sequence preempted meanwhile drops its
job (`Sequence.aside`), and the engine prefills it again as any other. When too few
streams decode to hold the prompt back any more (they ended), the engine recalls it: the
job stops at its next chunk, what it computed is copied in as above, and the engine's
steps finish the prompt on all the threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from redline.engine import compute
from redline.engine.llama import BatchEntry, LlamaModel, LlamaRunner, restream
from redline.engine.sequence import Sequence

log = logging.getLogger(__name__)

# a shorter prompt stays in the engine's steps: below 64 rows llama.cpp's attention runs
# a row at a time anyway, and the copies in and out cost more than its chunks
SIDE_MIN_TOKENS = 64


def side_threads(threads: int, slack: float | None) -> int:
    """The threads the side takes of an engine's `threads` (0: none to spare): as many as
    leave the streams' steps within (1 + slack)x their time on all of them (the prefill
    budget's own promise, if steps scale with threads), at most half, at least one. On 2
    cores that is 1 of 2 (the streams' steps ~1.8x: the figures above); on 8, 2 of 8."""
    if threads < 2:
        return 0
    share = (slack or 1.0) / (1.0 + (slack or 1.0))
    return max(1, min(threads // 2, int(threads * share)))


@dataclass
class SideJob:
    """`seq`'s context from `start` (what slot `slot` holds: `prefix`, its cells) to `end`
    (all but the last prompt token): `tokens` are its first `end` tokens."""

    seq: Sequence
    slot: int
    start: int
    end: int
    tokens: list[int]
    prefix: tuple[np.ndarray, int] | None = None
    state: tuple[np.ndarray, int] | None = None  # the cells of tokens[:end], once done
    error: BaseException | None = None
    stop: bool = False  # the engine closes: stop at the next chunk
    # the engine wants it back (too few streams decode now to hold it back): stop at the
    # next chunk and hand over what is done, `upto` tokens
    recall: bool = False
    upto: int = 0
    done: threading.Event = field(default_factory=threading.Event)


class SidePrefill:
    def __init__(self, model: LlamaModel, n_ctx: int, n_batch: int, threads: int,
                 streams: int) -> None:
        self.runner = LlamaRunner(model, n_ctx, 1, n_batch, threads, True, here=True)
        self.threads = threads
        self.n_ctx = n_ctx
        self.streams = streams  # the engine context's KV streams (llama.restream)
        self.job: SideJob | None = None  # the one running or done, not yet landed
        # the states copied in and out, in buffers used again: tens of MB of fresh pages
        # cost ~70 ms of page faults here, a stall if the engine's thread paid it
        self._in = np.empty(0, dtype=np.uint8)
        self._out = np.empty(0, dtype=np.uint8)

    def prefix(self, runner: LlamaRunner, seq_id: int) -> tuple[np.ndarray, int] | None:
        """The cells slot `seq_id` of the engine's context (`runner`) holds, as this
        context's state (None: not in a layout `restream` reads)."""
        self._in, size = runner.seq_state(seq_id, self._in)
        return restream(self._in, size, 1)

    @staticmethod
    def free() -> bool:
        """No prompt of any engine in this process is on the side now."""
        return compute.reserved() == 0

    def start(self, job: SideJob, wake: Callable[[], None]) -> None:
        """Run `job` on the side thread; `wake()` when it is done."""
        self.job = job
        compute.reserve(self.threads)
        compute.side().submit(self._run, job, wake)

    def _run(self, job: SideJob, wake: Callable[[], None]) -> None:
        r = self.runner
        try:
            r.clear()
            if job.prefix is not None and not r.set_seq_state(0, *job.prefix):
                raise RuntimeError("the side context could not take the prompt's cached prefix")
            job.upto = job.start
            while job.upto < job.end:
                if job.stop or job.seq.cancelled or job.seq.aside is not job:
                    return  # nobody wants it any more
                if job.recall:
                    break
                s, e = job.upto, min(job.upto + r.n_batch, job.end)
                r.decode([BatchEntry(job.tokens[i], i, 0, i == e - 1) for i in range(s, e)])
                job.upto = e
            if job.upto == job.start:
                return  # recalled before any chunk: nothing to hand over
            self._out, size = r.seq_state(0, self._out, 4 * (self.streams - 1))
            job.state = restream(self._out, size, self.streams)
            if job.state is None:
                raise RuntimeError("the side context's state is not in a layout this reads")
        except Exception as exc:  # the engine computes the prompt itself instead
            job.error = exc
            log.warning("a prompt on the side failed: %s", exc)
        finally:
            r.clear()
            compute.release(self.threads)
            job.done.set()
            wake()

    def close(self) -> None:
        job = self.job
        if job is not None:
            job.stop = True
            job.done.wait(timeout=30)
        self.runner.close()
