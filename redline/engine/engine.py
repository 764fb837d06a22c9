"""The embedded engine: one scheduler thread stepping llama.cpp.

    step():  batch = scheduler.schedule()  →  runner.decode(batch)  →  postprocess(batch)

Every step is taken under a turn of the process's `StepArbiter`, shared by all local
engines, and runs on the process's one compute thread (engine/compute.py): one
llama.cpp thread team for every model, one step at a time. While no other engine waits
for the turn, the engine's steps follow one another there (`_steps`); its own thread
waits for work, and for its turn, in between.

Requests enter from any thread or event loop through `generate()`, an async
iterator of `Chunk`s; closing the iterator cancels the sequence, and the slot is
free before the next step. A sequence that the scheduler preempts (a tier-S request
needed its slot, or nobody reads it) keeps its iterator: its chunks stop for a while
and go on where they were.

With speculative decoding (engine/speculative.py), a sequence's step may carry
draft tokens: `_postprocess` samples at each of them in turn and emits tokens while the
target agrees with the draft, then hands the rejected rest back to the scheduler.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator

import numpy as np

from redline.engine import compute
from redline.engine.arbiter import StepArbiter
from redline.engine.budget import FLOOR, PrefillBudget
from redline.engine.forecast import Forecast
from redline.engine.host_cache import Entry, HostCache
from redline.engine.llama import LlamaModel, LlamaRunner
from redline.engine.sampling import token_logprobs
from redline.engine.scheduler import KVOps, ScheduledBatch, Scheduler
from redline.engine.sequence import Sequence
from redline.engine.side import SIDE_MIN_TOKENS, SideJob, SidePrefill, side_threads
from redline.engine.speculative import NgramSettings, Prediction
from redline.errors import EngineDead
from redline.types import Chunk, FinishReason, Presence, SamplingParams, StageTimings, Usage, new_id

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, model: LlamaModel, *, n_ctx_per_seq: int, n_seq_max: int, n_batch: int,
                 n_threads: int, prefix_reuse: bool = True, arbiter: StepArbiter | None = None,
                 name: str = "engine", cache_cells: int | None = None, tiers: bool = True,
                 prefill_slack: float | None = 0.5, prefill_floor: int = FLOOR,
                 speculative: NgramSettings | None = None, host_cache_bytes: int = 0,
                 busy_cells: int | None = None, kv_unified: bool = True,
                 prefill_protect: int = 1, side_prefill: bool = False,
                 side_min_tokens: int = SIDE_MIN_TOKENS,
                 prefill_yield_to_waiting: bool = False) -> None:
        self.model = model
        self.n_ctx_per_seq = n_ctx_per_seq
        self.runner = LlamaRunner(model, n_ctx_per_seq, n_seq_max, n_batch, n_threads, kv_unified)
        # prefill_slack None: a fixed prefill budget (the rest of the batch every step)
        # prefixes the KV buffer forgets, kept in host memory (none with 0 bytes or no reuse)
        self.host = HostCache(host_cache_bytes) if host_cache_bytes > 0 and prefix_reuse else None
        self.scheduler = Scheduler(n_seq_max, n_batch, prefix_reuse, cache_cells, tiers,
                                   PrefillBudget(n_batch, prefill_slack, prefill_floor,
                                                 prefill_protect, prefill_yield_to_waiting),
                                   speculative, self.host, busy_cells)
        self.scheduler.contiguous = not kv_unified
        # long prompts beside decoding streams computed on some of the threads
        # (engine/side.py); not with one thread, which has nothing to split
        threads = self.runner.threads
        spare = side_threads(threads, prefill_slack)
        self.side = SidePrefill(model, n_ctx_per_seq, n_batch, spare, self.runner.n_stream) \
            if side_prefill and spare else None
        self.scheduler.side_min = side_min_tokens
        self.side_jobs = 0  # prompts that went to the side (and landed)
        self.side_tokens = 0  # the tokens those computed there
        self.side_recalls = 0  # of those, the ones taken back before their end
        self.forecast = Forecast(n_seq_max, self.scheduler.budget)
        if self.side is not None:
            self.forecast.side_factor = threads / self.side.threads
            self.forecast.side_min = side_min_tokens
        self.scheduler.step_cost = self.forecast.step_s  # how streams nobody reads ride
        self._inbox: list[Sequence] = []
        self._outbox: list[tuple[Sequence, Chunk]] = []
        self._wake = threading.Condition()
        self._stop = False
        self._dead: BaseException | None = None
        self.steps = 0
        self.draft_proposed = 0  # draft tokens fed for verification
        self.draft_accepted = 0  # of those, the ones the target chose too (emitted)
        # one engine alone still takes turns (uncontended: a lock per step)
        self.arbiter = arbiter or StepArbiter()
        self._member = self.arbiter.join(name, lambda: self.active)
        self._thread = threading.Thread(target=self._loop, name=f"engine-{id(self):x}", daemon=True)
        self._thread.start()

    # ---- public, any thread -------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        if self._dead is not None:
            raise EngineDead("the model engine stopped; retry on another replica") from self._dead
        with self._wake:
            self._inbox.append(seq)
            self._wake.notify()

    def poke(self) -> None:
        with self._wake:
            self._wake.notify()

    async def generate(self, prompt: list[int], sampling: SamplingParams,
                       request_id: str | None = None, tier: str | None = None,
                       presence: Presence | None = None,
                       prediction: list[int] | None = None) -> AsyncIterator[Chunk]:
        """`tier`: the order of service (S first; None: A); `presence`: tells when
        nobody reads the answer (it then yields its slot to those who wait);
        `prediction`: the tokens of a predicted answer, to draft from (speculative.py)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Chunk] = asyncio.Queue()
        seq = Sequence(request_id or new_id("seq"), prompt, sampling, queue.put_nowait, loop,
                       tier=tier or "A", presence=presence,
                       prediction=Prediction(prediction, len(prompt)) if prediction else None)
        self.submit(seq)
        try:
            while True:
                chunk = await queue.get()
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            seq.cancel()
            self.poke()

    @property
    def active(self) -> int:
        return len(self.scheduler.running) + len(self.scheduler.waiting) + len(self._inbox)

    def slowdown(self) -> float:
        """How much longer work takes here than alone (other engines' work): now, or
        over the last seconds if that was more (an answer outlasts this instant)."""
        return max(self.arbiter.slowdown(self._member),
                   self.arbiter.recent_slowdown(self._member))

    def cores_busy(self) -> float:
        """The share of the cores this process's local engines used lately."""
        return self.arbiter.utilization()

    def predict_ttft_s(self, prompt_tokens: int, tier: str | None,
                       tokens: list[int] | None = None) -> float | None:
        """This engine's forecast of a new request's TTFT, alone on the cores (None until
        its step costs are measured). With the prompt's `tokens`, only what no cached
        prefix holds is computed. Read from another thread: a snapshot may be torn by a
        step, which only makes this estimate a step stale."""
        for _ in range(3):
            try:
                running = list(self.scheduler.running)
                waiting = list(self.scheduler.waiting) + list(self._inbox)
                if tokens is not None:
                    prompt_tokens = len(tokens) - self.scheduler.reusable(tokens)
            except RuntimeError:  # a deque or the host cache changed under the copy
                continue
            return self.forecast.ttft_s(prompt_tokens, tier, running, waiting,
                                        self.scheduler.tiers, tokens, side=self.side is not None)
        return None

    def forget_costs(self) -> None:
        """Drop what steps were measured to cost (the prefill budget's and the forecast's
        averages and fits): the next steps measure them afresh. Call it while idle."""
        self.scheduler.budget.forget()
        self.forecast.forget()

    def predict_tpot_s(self) -> float | None:
        return self.forecast.tpot_s(min(len(self.scheduler.running) + len(self._inbox),
                                        self.forecast.n_slots - 1))

    def close(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join(timeout=10)
        self.arbiter.leave(self._member)
        if self.side is not None:
            self.side.close()
        self.runner.close()

    # ---- the scheduler thread ----------------------------------------------
    def _loop(self) -> None:
        try:
            while True:
                saves: list[tuple[int, list[int]]] = []
                with self._wake:
                    while not (self._stop or self._inbox or self.scheduler.has_work()):
                        saves = self.scheduler.idle_save()  # idle: copy a free slot out
                        if saves:
                            break
                        self._wake.wait()
                    if not saves:
                        if self._stop:
                            break
                        self._take_inbox()
                if saves:
                    self._save(saves)
                    continue
                self._before_step()
                if self.scheduler.has_work():
                    with self.arbiter.turn(self._member):
                        fed = compute.run(self._steps)
                    job = self.side.job if self.side is not None else None
                    if not fed and job is not None:
                        job.done.wait(0.05)  # nothing to step but a prompt on the side
                self._flush()
        except BaseException as exc:  # the engine is dead: tell every waiting client
            log.exception("engine thread died")
            self._dead = exc
            for seq in list(self.scheduler.running) + list(self.scheduler.waiting) + self._inbox:
                self._deliver(seq, Chunk(finish_reason="error", error="the model engine failed"))
            self._flush()

    def _steps(self) -> int:
        """Steps back to back on the compute thread, this engine holding the cores' turn,
        until it runs out of work or another engine waits for the turn; how many tokens
        the last step fed.

        Each step's `llama_decode` runs on the compute thread anyway (compute.py). Running
        the steps' Python there too saves two thread hand-offs a step, each a wake-up that
        has to preempt a spinning OpenMP thread on these cores (a single stream decodes
        a few per cent faster). Between steps it does what the engine thread's loop does:
        takes the new sequences in, drops the cancelled, lands and starts side prompts,
        and hands the tokens out."""
        while True:
            fed = self.step()
            self._flush()
            self.arbiter.charge(self._member)
            with self._wake:
                if self._stop or self.arbiter.contended(self._member):
                    return fed
                self._take_inbox()
            self._before_step()
            if not fed or not self.scheduler.has_work():
                return fed  # idle, or only a prompt on the side: the engine thread waits

    def _take_inbox(self) -> None:
        """The submitted sequences to the scheduler (the caller holds `_wake`)."""
        for seq in self._inbox:
            self.scheduler.add(seq)
        self._inbox.clear()

    def _before_step(self) -> None:
        """Drop the cancelled sequences; land a prompt the side has computed and send it
        the next one."""
        self._drop_cancelled()
        if self.side is not None:
            self._side_poll()

    def _deliver(self, seq: Sequence, chunk: Chunk) -> None:
        self._outbox.append((seq, chunk))

    def _flush(self) -> None:
        """Hand this step's chunks to their event loops: one wake-up per loop per step,
        not one per token (the loop thread competes with llama.cpp for the cores)."""
        if not self._outbox:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Sequence, Chunk]]] = {}
        for seq, chunk in self._outbox:
            by_loop.setdefault(seq.loop, []).append((seq, chunk))
        self._outbox = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_dispatch, items)
            except RuntimeError:  # that loop is closed: its clients are gone
                pass

    def step(self) -> int:
        """One batch; how many tokens it fed."""
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        self._decode(batch)
        self._postprocess(batch)
        seconds = time.perf_counter() - t0
        if not compute.reserved():  # on fewer threads, a step's cost is not its cost alone
            self.scheduler.observe(batch, seconds)  # the prefill budget learns
            self.forecast.observe_step(batch.n_decode, len(batch.entries) - batch.n_decode,
                                       seconds)
        self.steps += 1
        return len(batch.entries)

    # ---- prompts on the side (engine/side.py) ---------------------------------
    def _side_poll(self) -> None:
        """Between steps: land a prompt the side has computed, and send it the next one."""
        side = self.side
        assert side is not None
        job = side.job
        if job is not None:
            if not job.done.is_set():
                if not job.recall and self.scheduler.side_recall():
                    job.recall = True  # the streams it was held back for are gone
                return
            side.job = None
            self._side_land(job)
        self._side_next(side)
        # held-back prompts wait for the side while it is taken (this engine's or another's)
        self.scheduler.side_busy = not side.free()

    def _side_next(self, side: SidePrefill) -> None:
        if not side.free():
            return  # another engine's prompt is on the side
        seq = self.scheduler.side_candidate(self.scheduler.side_min)
        if seq is None:
            return
        end = seq.prefill_to - 1  # its last token runs here, for the logits of its first
        start = seq.n_fed  # what its slot holds (a cached prefix, chunks fed so far)
        prefix = None
        if start:  # its slot's cells go along, as a one-stream state
            prefix = side.prefix(self.runner, seq.seq_id)
        if end > side.n_ctx or (start and prefix is None):
            seq.no_side = True  # not a state the side can take: the engine's steps run it
            return
        job = SideJob(seq, seq.seq_id, start, end, seq.context()[:end], prefix)
        seq.aside = job
        if seq.scheduled_at is None:
            seq.scheduled_at = time.perf_counter()
        side.start(job, self.poke)

    def _side_land(self, job: SideJob) -> None:
        """Copy a done job's cells into its slot; a failed or unwanted one is dropped, and
        its sequence (if still here) computes its prompt in the engine's steps."""
        seq = job.seq
        if seq.aside is not job:
            return  # preempted meanwhile (its slot may be another's now)
        seq.aside = None
        if seq.cancelled or seq not in self.scheduler.running:
            return
        if job.state is None:
            if job.error is not None:  # it failed (logged): the engine's steps run it
                seq.no_side = True
            return  # or it was recalled before its first chunk
        slot = self.scheduler.slots[job.slot]
        self.runner.seq_remove(job.slot, -1, -1)
        if self.runner.set_seq_state(job.slot, *job.state):
            slot.tokens = job.tokens[:job.upto]
            seq.n_fed = job.upto
            self.side_jobs += 1
            self.side_tokens += job.upto - job.start
            self.side_recalls += job.upto < job.end
        else:  # no room in the buffer: from the start, here
            slot.tokens = []
            seq.n_fed = 0
            seq.no_side = True

    def _drop_cancelled(self) -> None:
        for seq in self.scheduler.reap_cancelled():
            if seq.n_fed or seq.output:
                self._deliver(seq, self._final(seq, "cancelled", ""))

    def _decode(self, batch: ScheduledBatch) -> None:
        for kind, op in batch.kv.order:
            if kind == "save":
                self._save([op])
            elif kind == "remove":
                seq_id, p0 = op
                if not self.runner.seq_remove(seq_id, p0, -1):
                    self._reset_slot(seq_id)
            elif kind == "copy":
                self.runner.seq_copy(*op)
            else:
                self._restore(*op)
        if not batch.entries:
            return
        while True:
            try:
                self.runner.decode(batch.entries)
                break
            except RuntimeError:
                # KV full: forget idle slots' cached prefixes, oldest first, until it fits
                kv = KVOps()
                victim = self.scheduler.evict_oldest(kv)
                if victim is None:
                    raise
                self._save(kv.saves)
                self.runner.seq_remove(victim, -1, -1)
        self.scheduler.commit(batch)

    def _save(self, saves: list[tuple[int, list[int]]]) -> None:
        """Copy slots' cells to the host cache before they are forgotten."""
        if self.host is None:
            return
        for seq_id, tokens in saves:
            state, size = self.runner.seq_state(seq_id)
            if size:
                self.host.put(tokens, state, size)

    def _restore(self, seq_id: int, entry: Entry, keep: int) -> None:
        """Copy a host cache entry back into slot `seq_id` and keep its first `keep` tokens;
        when llama.cpp refuses (no room), the slot's sequence computes its prompt."""
        assert self.host is not None
        if entry.payload is not None and self.runner.set_seq_state(seq_id, entry.payload, entry.size) \
                and self.runner.seq_remove(seq_id, keep, -1):
            self.host.used_for(entry, keep)
            return
        self.host.discard(entry)
        self._reset_slot(seq_id)

    def _reset_slot(self, seq_id: int) -> None:
        """A partial removal was refused: recompute the whole prompt in this slot."""
        self.runner.seq_remove(seq_id, -1, -1)
        slot = self.scheduler.slots[seq_id]
        slot.tokens = []
        if slot.owner is not None:
            slot.owner.n_fed = slot.owner.reused = 0
            if not slot.owner.preemptions:
                slot.owner.cached = 0

    def _postprocess(self, batch: ScheduledBatch) -> None:
        now = time.perf_counter()
        for seq, index, pos in batch.scored:  # before sampling, which may edit the logits
            seq.prompt_lps.append(token_logprobs(self.runner.logits(index), seq.prompt[pos + 1],
                                                 seq.sampling.prompt_logprobs or 0,
                                                 self.model.piece))
        for seq, index in batch.samplers:
            draft = batch.drafts.get(index, [])
            # position i's logits follow draft[:i]: valid while the target chose the same
            accepted = 0
            for i in range(len(draft) + 1):
                token, done = self._emit(seq, index + i, now, (len(draft), i))
                if done or i == len(draft) or token != draft[i]:
                    break
                accepted += 1
            if draft:
                self.draft_proposed += len(draft)
                self.draft_accepted += accepted
                self.scheduler.verified(seq, len(draft), accepted)

    def _emit(self, seq: Sequence, index: int, now: float,
              drafted: tuple[int, int] = (0, 0)) -> tuple[int, bool]:
        """Sample `seq`'s next token from batch entry `index` and deliver it; the token,
        and whether the sequence finished. `drafted`: this step's draft tokens and how
        many of them were taken before this one (not yet counted: the step goes on)."""
        s = seq.sampling
        logits = self.runner.logits(index)
        scores = logits.copy() if s.logprobs else logits  # the sampler may edit
        early = bool(s.min_tokens) and len(seq.output) < (s.min_tokens or 0)
        if early:  # vLLM's min_tokens: nothing may end the answer yet
            logits[self.model.eog_ids] = -np.inf
            if s.stop_token_ids:
                logits[list(s.stop_token_ids)] = -np.inf
        token = seq.sampler.sample(self.runner.ctx, index, logits)
        first = seq.first_token_at is None
        if first:
            seq.first_token_at = now
        reason: FinishReason | None = None
        text = ""
        kept = not (self.model.is_eog(token) and not s.ignore_eos)
        if not kept:
            reason = "stop"
        else:
            seq.output.append(token)
            t0 = time.perf_counter()
            text = seq.detok.feed(self.model.piece(token),
                                  check=len(seq.output) >= (s.min_tokens or 0))
            seq.detok_s += time.perf_counter() - t0
            if seq.detok.stopped or (s.stop_token_ids and token in s.stop_token_ids):
                reason = "stop"  # a stop id is kept, as vLLM keeps it (its text, if any)
            elif len(seq.output) >= seq.sampling.max_tokens:
                reason = "length"
            elif len(seq.prompt) + len(seq.output) >= self.n_ctx_per_seq:
                reason = "length"
        if reason is None:
            timings = self._timings(seq, now) if first else None
            chunk = Chunk(text=text, tokens=1, timings=timings)
        else:
            self.scheduler.finish(seq)
            self.forecast.finished(len(seq.output))
            # the last token counts though its text is empty (a control token
            # under ignore_eos, bytes the detokenizer holds); an end token not kept does not
            chunk = self._final(seq, reason, text + seq.detok.flush(),
                                tokens=1 if kept else 0, drafted=drafted)
        chunk.constrained = seq.sampler.constrained
        if seq.sampling.logprobs and kept:
            chunk.logprobs = (token_logprobs(scores, token, seq.sampling.top_logprobs or 0,
                                             self.model.piece),)
        if first and seq.scores_prompt:
            chunk.prompt_logprobs = tuple(seq.prompt_lps)
        self._deliver(seq, chunk)
        return token, reason is not None

    @staticmethod
    def _timings(seq: Sequence, end: float) -> StageTimings:
        t = StageTimings()
        start = seq.scheduled_at or end
        first = seq.first_token_at or end
        t.add("queue", start - seq.arrival)
        t.add("prefill", first - start)
        t.add("decode", end - first)
        t.add("detokenize", seq.detok_s)
        return t

    def _final(self, seq: Sequence, reason: FinishReason, text: str, tokens: int = 0,
               drafted: tuple[int, int] = (0, 0)) -> Chunk:
        t = self._timings(seq, time.perf_counter())
        p = seq.prediction  # what the predicted answer gave: its drafts, kept and not
        details = None
        if p is not None:
            proposed, accepted = p.proposed + drafted[0], p.accepted + drafted[1]
            details = {"accepted_prediction_tokens": accepted,
                       "rejected_prediction_tokens": proposed - accepted}
        usage = Usage(len(seq.prompt), len(seq.output), cached_tokens=seq.cached,
                      completion_details=details)
        return Chunk(text=text, tokens=tokens, finish_reason=reason, usage=usage, timings=t)


def _dispatch(items: list[tuple[Sequence, Chunk]]) -> None:
    for seq, chunk in items:
        seq.emit(chunk)
