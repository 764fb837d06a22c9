"""Continuous batching with prefix reuse.

Each step the scheduler builds one llama.cpp batch of at most `n_batch` tokens:
first one token for every decoding sequence (so running streams never stall),
then prompt chunks of sequences in prefill, admitting waiting ones while a slot
is free. A finished or cancelled sequence leaves at the next step.

Prefix reuse: a slot (llama.cpp sequence id) keeps the KV of its last tokens after
its sequence leaves. A new prompt takes the free slot whose cached tokens share the
longest prefix with it, or copies the shared prefix from a running sequence
(`seq_cp`: cells are shared in the unified KV buffer, nothing is recomputed). When the
best free slot shares less than half of the prompt (a chat template's first tokens), it
takes an empty slot, else the one used longest ago, so that a trivial match does not
overwrite a prefix worth more to the next request that shares it. A prompt whose shared
prefix another sequence is still computing (its prefill has not got that far) waits for
it and then copies it, rather than computing the same tokens again beside it.

Order (with `tiers`, the default): a tier-S sequence is admitted and prefilled before
waiting A and B work. Under pressure (no free slot) a waiting S takes the slot of a
running B, and a waiting request whose client reads takes the slot of a stream nobody
reads now (its client left; it generates on for a resume): preempt and continue, as
vLLM's priority preemption does. The preempted sequence keeps its generated token ids
and its sampler; its slot becomes a free slot (its cells are reused or forgotten like
any cached prefix), and when it is admitted again its prompt and output are recomputed
as one prefill (prefix reuse finds what is still cached) and it decodes on: its client
sees the same stream go on, later, with no token lost or repeated.

Prefill budget: while streams decode, a step carries only the prompt tokens that
`PrefillBudget` allows (engine/budget.py: the streams' inter-token latency stays near
their TPOT), except that a read prompt with little work left finishes whole, and beside
fewer than `budget.protect` decoding streams, or when it does not wait alone (another long
prompt in its slot, or a request queued for a slot: `budget.yield_to_waiting`), a long one
takes the rest of the batch; when nothing decodes, the whole batch.

Streams nobody reads run on spare time: their prompts (a recompute after preemption)
run only in steps nobody reads, and they pause while a read prompt runs, so a newcomer's
first token never shares its steps with them; beside read streams they decode only as
many as keep the step within (1 + slack)x the step without them, and alone only as many
as keep a step within (1 + slack)x a single stream's step (a newcomer arriving then
waits about that long). The costs are the engine's measured step fit (`step_cost`);
until it is known, or with a fixed budget, they all ride. On a CPU a step's cost grows
with its streams, so they mostly wait for idle steps; where batching is nearly free (a
GPU), they all ride.

Speculative decoding (`drafter`, engine/speculative.py): a decoding sequence may carry
draft tokens after its decode token, each with logits; the engine verifies them and calls
`verified`, and the rejected ones' cells leave the KV before the next step.

The cells that free slots keep for reuse are bounded (`cache_cells`): past the bound, the
slot used longest ago is forgotten first, before the next step. With a host cache
(engine/host_cache.py) a forgotten prefix is first copied to host memory, and a prompt
that shares more with a saved one than with anything in the buffer has it copied back
into its slot (`restores`) instead of computing it again. Every step attends over
the cells in use, and a full buffer fails a decode: when one fails, the engine forgets
free slots' prefixes oldest first, one at a time, until it fits (`evict_oldest`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redline.engine.budget import PrefillBudget
from redline.engine.host_cache import Entry, HostCache
from redline.engine.llama import BatchEntry
from redline.engine.prefix import common_prefix
from redline.engine.sequence import TIER_RANK, SeqState, Sequence
from redline.engine.speculative import NgramIndex, NgramSettings


@dataclass
class Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # what its KV holds, in order
    owner: Sequence | None = None
    last_used: float = 0.0
    saved: int = 0  # len(tokens) when `idle_save` last looked at them


@dataclass(frozen=True)
class Placement:
    """A free slot for a new sequence, and the `reused` leading tokens of its context it
    starts with: kept in place, copied from `source` (another slot, running or not), or
    restored from a host cache `entry`."""

    slot: Slot
    reused: int
    source: Slot | None = None
    entry: Entry | None = None


@dataclass
class KVOps:
    """Cache edits to apply before the batch, in the order they were made (`order`):
    (seq, tokens) saves to the host cache (the slot's cells as they are), (seq, p0)
    removals, (src, dst, p0, p1) copies, (seq, entry, keep) restores of a host entry's
    first `keep` tokens. In order, because a free slot that one newcomer copies a prefix
    from may be given to the next newcomer in the same step, which removes its cells."""

    order: list[tuple[str, Any]] = field(default_factory=list)

    def _of(self, kind: str) -> list[Any]:
        return [op for k, op in self.order if k == kind]

    @property
    def removals(self) -> list[tuple[int, int]]:
        return self._of("remove")

    @property
    def copies(self) -> list[tuple[int, int, int, int]]:
        return self._of("copy")

    @property
    def saves(self) -> list[tuple[int, list[int]]]:
        return self._of("save")

    @property
    def restores(self) -> list[tuple[int, Entry, int]]:
        return self._of("restore")

    def remove(self, seq_id: int, p0: int) -> None:
        self.order.append(("remove", (seq_id, p0)))

    def copy(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.order.append(("copy", (src, dst, p0, p1)))

    def save(self, seq_id: int, tokens: list[int]) -> None:
        self.order.append(("save", (seq_id, tokens)))

    def restore(self, seq_id: int, entry: Entry, keep: int) -> None:
        self.order.append(("restore", (seq_id, entry, keep)))


@dataclass
class ScheduledBatch:
    entries: list[BatchEntry]
    # (sequence, batch index of its logits) for sequences that sample this step
    samplers: list[tuple[Sequence, int]]
    # (sequence, tokens fed this step) to append to its slot once the decode succeeds
    fed: list[tuple[Sequence, list[int]]]
    kv: KVOps
    n_decode: int = 0  # entries that are decode tokens and drafts (the rest are prompt chunks)
    # batch index of a sequence's decode token -> the draft tokens that follow it there
    drafts: dict[int, list[int]] = field(default_factory=dict)
    # (sequence, batch index, prompt position) whose logits score the next prompt token
    scored: list[tuple[Sequence, int, int]] = field(default_factory=list)


# a waiting prompt waits for another's prefill only to save at least this many tokens
MIN_WAIT_PREFIX = 32
# a host cache entry is copied back when it holds more of the prompt than any slot by
# MIN_RESTORE tokens, plus one for every RESTORE_CELLS_PER_TOKEN cells it holds (all of
# them are copied back, then those past the prompt's share removed). Measured (SmolLM2
# BF16, 2 threads, session 25): copying 124 / 1,600 cells back takes 0.2 / 4.1 ms, a
# prompt token computed in a small batch 1.3-4 ms; 32 tokens, the rule before, left a
# prompt that shared ~50 tokens with an entry and 24 with every slot computing ~26 more
MIN_RESTORE = 4
RESTORE_CELLS_PER_TOKEN = 256
# a slot's cells are copied to the host cache before they go only when it loses this many
# (a copy out costs 2-10 ms on the engine thread: it allocates a buffer)
MIN_SAVE = 32
# while sequences decode, a freed slot keeps its cells this long past `busy_cells`: the
# same client's next request (or a burst's) comes within it and reuses them in place
BUSY_IDLE_S = 0.05
# prompt tokens a step computes for a sequence that scores its prompt: each keeps a row of
# logits (a vocabulary's floats), which llama.cpp's output buffer then holds
SCORED_ROWS = 64


def restore_gain(entry: Entry) -> int:
    """How many more prompt tokens than any slot a host cache entry must hold to be
    copied back: its copy's cost in prompt tokens, and a margin."""
    return MIN_RESTORE + len(entry.tokens) // RESTORE_CELLS_PER_TOKEN


class Scheduler:
    def __init__(self, n_seq_max: int, n_batch: int, prefix_reuse: bool = True,
                 cache_cells: int | None = None, tiers: bool = True,
                 budget: PrefillBudget | None = None,
                 drafter: NgramSettings | None = None, host: HostCache | None = None,
                 busy_cells: int | None = None) -> None:
        self.slots = [Slot(i) for i in range(n_seq_max)]
        self.n_batch = n_batch
        self.prefix_reuse = prefix_reuse
        self.cache_cells = cache_cells  # cells free slots may keep for reuse; None: no bound
        # the same while a sequence decodes: each decode step attends over every cell in
        # use, so idle slots' cells slow it (None: cache_cells again)
        self.busy_cells = busy_cells
        self.tiers = tiers  # False: first come, first served (unread streams still yield)
        self.budget = budget or PrefillBudget(n_batch)
        self.evictions = 0
        self.preemptions = 0
        self.drafter = drafter  # None: no speculative decoding
        self.host = host  # where forgotten prefixes go (engine/host_cache.py); None: nowhere
        self._rollbacks: list[tuple[int, int]] = []  # rejected drafts' cells: (seq, p0)
        # a decode-only step's seconds with n streams (the engine's fit), or None
        self.step_cost: Callable[[int], float | None] | None = None
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.contiguous = False  # one KV stream per slot: place newcomers beside running ones
        # set by the engine while the side (engine/side.py) computes a prompt: the prompts
        # that would go there next wait for it (`side_min` tokens and more) rather than run
        # in small chunks on the threads it leaves (each at twice a chunk's cost there)
        self.side_busy = False
        self.side_min = 0
        self._alone_last = False  # the last step was a short prompt's alone (`_alone`)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def reap_cancelled(self) -> list[Sequence]:
        """Drop cancelled sequences (waiting or running); returns them."""
        gone = [s for s in self.running if s.cancelled] + [s for s in self.waiting if s.cancelled]
        for seq in gone:
            self.finish(seq)
        return gone

    def finish(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.state = SeqState.FINISHED
        seq.sampler.close()  # also one that waits (preempted): it had a sampler too
        if seq.slot is not None:
            slot = self.slots[seq.slot]
            slot.owner = None
            slot.last_used = time.perf_counter()

    def schedule(self) -> ScheduledBatch:
        entries: list[BatchEntry] = []
        samplers: list[tuple[Sequence, int]] = []
        scored: list[tuple[Sequence, int, int]] = []
        fed: list[tuple[Sequence, list[int]]] = []
        kv = KVOps([("remove", r) for r in self._rollbacks])  # a rejected draft's cells first
        self._rollbacks = []
        self._trim(kv, self.cache_cells)
        # 1. admit waiting sequences, best first, while a slot is free or one yields
        waited = len(self.waiting)
        self._admit(kv)
        # a newcomer has taken what it reuses: now, and while anyone decodes, free slots
        # keep at most `busy_cells` (the rest to the host cache, where the idle engine
        # has copied them already: `idle_save`). An idle engine keeps them for the next
        # request, and the newcomer's steps all see the same cells (identical greedy
        # requests one after another get identical answers). With most slots busy, a
        # freed slot is taken again soon: it keeps its cells then
        if self.busy_cells is not None and 2 * len(self.running) <= len(self.slots) \
                and (len(self.waiting) < waited or any(not q.in_prefill for q in self.running)):
            self._trim(kv, self.busy_cells, time.perf_counter() - BUSY_IDLE_S)
        # 2. decode: one token for each sequence past its prompt, and its draft if any;
        # streams nobody reads pause while a read one runs its prompt, and otherwise
        # ride as cost allows (see the module's docstring)
        pause = any(q.in_prefill and not q.unread and q.aside is None for q in self.running)
        anyone_reads = any(not q.unread for q in self.running)
        ready = [q for q in self.running if not q.in_prefill]
        decoding = [q for q in ready if not q.unread]
        reading = len(decoding)  # read streams decoding (`for_side` counts them)
        alone = self._alone(reading) if self.contiguous and reading else []
        hold_short = bool(alone) and self._alone_last
        if hold_short:
            alone = []  # the streams' turn: short newcomers wait for the next step
        self._alone_last = bool(alone)
        if alone:
            decoding = []  # this step is the newcomers' prompts alone; the streams go next
        elif not pause:
            decoding += self._riders([q for q in ready if q.unread], len(decoding))
        drafts: dict[int, list[int]] = {}
        spare = self.n_batch - len(decoding)  # the room drafts may take
        for seq in decoding:
            token = seq.output[-1]
            index = len(entries)
            samplers.append((seq, index))
            entries.append(BatchEntry(token, seq.n_fed, seq.seq_id, True))
            draft = self._draft(seq, len(decoding), spare)
            for i, t in enumerate(draft):
                entries.append(BatchEntry(t, seq.n_fed + 1 + i, seq.seq_id, True))
            if draft:
                drafts[index] = draft
                spare -= len(draft)
            fed.append((seq, [token, *draft]))
        n_decode = len(entries)
        # 3. prefill: prompt chunks, best first, within the step's prompt budget
        budget = min(self.budget.tokens(n_decode), self.n_batch - n_decode)
        if not anyone_reads:  # an unread stream's prompt keeps the step short too
            budget = min(budget, self._unread_prompt(n_decode))
        order = alone or self._ranked()
        for seq in order:
            if budget <= 0:
                break
            if not seq.in_prefill or seq.aside is not None or (anyone_reads and seq.unread):
                continue  # an unread stream's prompt waits for a step nobody reads
            if hold_short and self._short_newcomer(seq, reading):
                continue  # it gets a step of its own next
            if self.side_busy and self.for_side(seq, reading, self.side_min):
                continue  # it waits for the side
            first = seq.scheduled_at is None
            if first:
                seq.scheduled_at = time.perf_counter()
            start = seq.n_fed
            take = budget
            left = seq.prefill_to - start
            if left > budget and not seq.unread and ((first and self.budget.whole(left))
                                                     or self.budget.yields(
                                                         len(decoding), self.pending_prompts())):
                # a short prompt goes whole; beside few decoding streams, or not waiting
                # alone, a long one takes the rest of the batch (budget.py)
                take = self.n_batch - len(entries)
            scoring = seq.scores_prompt
            if scoring:
                take = min(take, SCORED_ROWS)
            end = min(start + take, seq.prefill_to)
            chunk = seq.context()[start:end]
            budget -= len(chunk)
            last = end == seq.prefill_to
            for i, token in enumerate(chunk):
                want = last and i == len(chunk) - 1
                if want:
                    samplers.append((seq, len(entries)))
                if scoring and seq.scored(start + i):
                    scored.append((seq, len(entries), start + i))
                    want = True
                entries.append(BatchEntry(token, start + i, seq.seq_id, want))
            fed.append((seq, chunk))
        return ScheduledBatch(entries, samplers, fed, kv, n_decode, drafts, scored)

    def _short_newcomer(self, seq: Sequence, decoding: int) -> bool:
        """A read prompt not yet scheduled that runs whole in one step beside `decoding`
        streams (within the budget, or short enough to go whole), with 2 tokens or more
        to compute."""
        if not seq.in_prefill or seq.aside is not None or seq.unread or seq.scores_prompt \
                or seq.scheduled_at is not None:
            return False
        left = seq.prefill_to - seq.n_fed
        return left >= 2 and (left <= self.budget.tokens(decoding) or self.budget.whole(left))

    def _alone(self, decoding: int) -> list[Sequence]:
        """With one KV stream per slot, a step with decoding streams and a prompt makes two
        forward passes, one for the streams' tokens and one for the prompt's rest, and the
        newcomer's first token waits for both. A short newcomer's prompt runs alone in a
        step instead (one pass), and the streams decode in the next, beside it: their
        token comes after the same two passes, the newcomer's a pass sooner. Steps
        alternate (`_alone_last`), so that several newcomers at once do not hold the
        streams for several prompts in a row.

        While requests queue for a slot, a burst (at least as many short newcomers as
        streams decoding: those are the burst's first members) shares its step instead,
        as many as fit in the batch: their prompts in one pass (`LlamaRunner.decode` pads
        them into as few as pays) cost less than a pass each, and with a queue, how soon a
        newcomer gets a slot is how fast the streams end. With every client in a slot,
        grouping would put the streams in step (they start together, end together, and
        the next wave comes as a burst again): each newcomer would wait for its wave's
        prompts (at 8 streams the first token 199 against 89 ms; docs/BENCHMARKS.md,
        session 33)."""
        short = [seq for seq in self._ranked() if self._short_newcomer(seq, decoding)]
        if not self.waiting or len(short) < max(2, decoding):
            return short[:1]
        group, room = [], self.n_batch
        for seq in short:
            left = seq.prefill_to - seq.n_fed
            if left > room:
                break
            group.append(seq)
            room -= left
        return group or short[:1]

    def _ranked(self) -> list[Sequence]:
        """Running sequences in the order their prompts are served: by tier, else as
        they came."""
        return sorted(self.running, key=lambda q: q.rank(self.tiers)) if self.tiers \
            else self.running

    def side_candidate(self, min_tokens: int) -> Sequence | None:
        """The prompt to compute on the side now (engine/side.py), best ranked first: one
        the budget would hold back (`for_side`)."""
        decoding = self._reading_decoders()
        for seq in sorted(self.running, key=lambda q: q.rank(self.tiers)):
            if self.for_side(seq, decoding, min_tokens):
                return seq
        return None

    def for_side(self, seq: Sequence, decoding: int, min_tokens: int) -> bool:
        """Whether `seq`'s prompt goes to the side, with `decoding` read streams decoding:
        one the budget would hold back (at least `budget.protect` of them, and it is not
        short enough to go whole), with at least `min_tokens` left to compute. Not one that
        scores its prompt (each of its rows is sampled here), one nobody reads, or one the
        side failed once."""
        if self.budget.slack is None or decoding == 0:
            return False
        if not seq.in_prefill or seq.aside is not None or seq.unread or seq.scores_prompt \
                or seq.no_side:
            return False
        left = seq.prefill_to - seq.n_fed
        # the count of users waiting last: only for a prompt that would otherwise go
        return left >= min_tokens and not self.budget.whole(left) \
            and not self.budget.yields(decoding, self.pending_prompts())

    def side_recall(self) -> bool:
        """A prompt on the side is no longer held back: too few read streams decode now
        (they ended), or another user waits for a first token beside it, so the engine's
        steps take it on all the threads."""
        decoding = self._reading_decoders()
        return decoding == 0 or self.budget.yields(decoding, self.pending_prompts())

    def _reading_decoders(self) -> int:
        return sum(1 for q in self.running if not q.in_prefill and not q.unread)

    def pending_prompts(self) -> int:
        """Users waiting for a first token that a long prompt would be held back with
        (`PrefillBudget.yields`): read prompts in their slots too long to go whole, and
        read requests queued for a slot."""
        if not self.budget.yield_to_waiting:
            return 0
        return sum(1 for q in self.running if q.in_prefill and not q.unread
                   and not self.budget.whole(q.prefill_to - q.n_fed)) \
            + sum(1 for q in self.waiting if not q.unread)

    def _limit(self, reading: int) -> float | None:
        """The longest step streams nobody reads may make beside `reading` read ones."""
        cost, slack = self.step_cost, self.budget.slack
        if cost is None or slack is None:
            return None
        base = cost(max(1, reading))
        return None if base is None else (1 + slack) * base

    def _riders(self, unread: list[Sequence], reading: int) -> list[Sequence]:
        """The unread decoding streams that ride this step, fewest written first."""
        limit = self._limit(reading)
        if limit is None or not unread:
            return unread
        cost = self.step_cost
        assert cost is not None
        k = 0
        while k < len(unread) and (cost(reading + k + 1) or 0.0) <= limit:
            k += 1
        if not reading:
            k = max(k, 1)  # alone they always advance
        return sorted(unread, key=lambda q: len(q.output))[:k]

    def _unread_prompt(self, decoding: int) -> int:
        """Prompt tokens an unread stream's recompute may add to a step nobody reads."""
        limit, token_s = self._limit(0), self.budget.token_s
        if limit is None or token_s is None:
            return self.n_batch
        used = (self.step_cost(decoding) or 0.0) if decoding and self.step_cost else 0.0
        return max(1, int((limit - used) / max(token_s, 1e-9)))  # it always advances

    def _draft(self, seq: Sequence, decoding: int, spare: int) -> list[int]:
        """Draft tokens for `seq` this step (any sequence: see speculative.py), never past
        its max_tokens, none while the batch is busy."""
        if seq.prediction is None and seq.lookup is None and self.drafter is not None:
            seq.lookup = NgramIndex(self.drafter)
        drafter = seq.drafter  # the client's predicted answer first, else its own n-grams
        if drafter is None or decoding > drafter.s.max_decoding or spare <= 0:
            return []
        # a step emits at most len(draft) + 1 tokens
        limit = min(spare, seq.sampling.max_tokens - len(seq.output) - 1)
        return drafter.propose(seq.tokens, limit)

    def verified(self, seq: Sequence, proposed: int, accepted: int) -> None:
        """`seq`'s draft of `proposed` tokens had its first `accepted` taken: the rest are
        not its tokens; forget them, and their cells before the next step."""
        if seq.drafter is not None:
            seq.drafter.verified(proposed, accepted)
        drop = proposed - accepted
        if drop <= 0 or seq.slot is None:
            return
        slot = self.slots[seq.slot]
        del slot.tokens[len(slot.tokens) - drop:]
        seq.n_fed -= drop
        self._rollbacks.append((slot.seq_id, len(slot.tokens)))

    def observe(self, batch: ScheduledBatch, seconds: float) -> None:
        """A step ran in `seconds`: teach the prefill budget its costs."""
        self.budget.observe(batch.n_decode, len(batch.entries) - batch.n_decode, seconds)

    def _next_waiting(self, held: list[Sequence]) -> Sequence | None:
        candidates = [q for q in self.waiting if q not in held] if held else self.waiting
        if not candidates:
            return None
        if not self.tiers and not any(q.unread for q in candidates):
            return candidates[0]  # first come, first served
        return min(candidates, key=lambda q: q.rank(self.tiers))

    def _admit(self, kv: KVOps) -> None:
        held: list[Sequence] = []  # waiting for a prefix another sequence is computing
        while (seq := self._next_waiting(held)) is not None:
            if self.prefix_reuse and not seq.scores_prompt and self._prefix_in_flight(seq):
                held.append(seq)
                continue
            if not any(s.owner is None for s in self.slots):
                victim = self._victim(seq)
                if victim is None:
                    return
                self.preempt(victim)
            self.waiting.remove(seq)
            self._place(seq, kv)
            self.running.append(seq)

    def _prefix_in_flight(self, seq: Sequence) -> bool:
        """A running sequence is still computing a prefix that `seq` shares (at least half
        of `seq`'s context and `MIN_WAIT_PREFIX` tokens more than any slot holds now):
        `seq` waits until those cells exist and copies them, instead of computing the same
        prefix again beside it (many users of one system prompt arriving together)."""
        context = seq.context()
        limit = len(context) - 1
        held = max((min(common_prefix(s.tokens, context), limit) for s in self.slots), default=0)
        for run in self.running:
            if not run.in_prefill or (run.unread and not seq.unread):
                continue  # an unread prompt runs only in spare steps: do not wait on it
            shared = min(common_prefix(run.context(), context), limit)
            if shared * 2 >= len(context) and shared >= held + MIN_WAIT_PREFIX \
                    and run.n_fed < shared:
                return True
        return False

    def _victim(self, seq: Sequence) -> Sequence | None:
        """The running sequence that gives its slot to waiting `seq`, if one should: a
        stream nobody reads to one somebody does; a tier-B one to a tier-S one. The
        lowest ranked goes, the latest arrived first among equals (it has done least)."""
        if seq.unread:
            return None
        def yields(q: Sequence) -> bool:
            return q.unread or (self.tiers and seq.tier == "S" and q.tier == "B")
        candidates = [q for q in self.running if yields(q)]
        if not candidates:
            return None
        return max(candidates, key=lambda q: (q.unread, TIER_RANK.get(q.tier, 1), q.arrival))

    def preempt(self, seq: Sequence) -> None:
        """`seq` gives its slot away and waits again, keeping its output and sampler; its
        slot's cells stay as a free slot's cached prefix (reused if still there)."""
        self.running.remove(seq)
        slot = self.slots[seq.seq_id]
        slot.owner = None
        slot.last_used = time.perf_counter()
        seq.preempted()
        self.waiting.append(seq)
        self.preemptions += 1

    def _choose(self, context: list[int], free: list[Slot], reuse: bool = True) -> Placement:
        """Where a sequence with `context` goes now, and what it reuses: the longest cached
        prefix we have, in a free slot (kept in place), in a running sequence's slot
        (copied), or in the host cache (copied back); nothing without `reuse` (a sequence
        that scores its prompt computes all of it). Pure: `_place` carries it out, and
        `reusable` forecasts with the same decision."""
        reuse = reuse and self.prefix_reuse
        limit = len(context) - 1  # the last token must run to give logits
        shared = {s.seq_id: min(common_prefix(s.tokens, context), limit)
                  if reuse else 0 for s in self.slots}
        best_free = max(free, key=lambda s: shared[s.seq_id])
        # little in common (a chat template's first tokens): taking that slot would throw
        # away a prefix worth more to someone else (llama-server's default slot
        # similarity, 0.5); an empty slot, else the one used longest ago (one KV stream
        # per slot: first one beside running slots)
        spare = min(free, key=lambda s: (-self._neighbours(s), bool(s.tokens), s.last_used))
        if shared[best_free.seq_id] * 2 < len(context):
            best_free = spare
        best_free_n = shared[best_free.seq_id]
        # the longest prefix another slot holds, running or not: its cells are shared
        # into the chosen slot (a metadata copy in the unified buffer), so a newcomer in
        # an empty slot still skips the chat template's system prompt that every slot has
        source = max((s for s in self.slots if s is not best_free),
                     key=lambda s: shared[s.seq_id], default=None)
        source_n = shared[source.seq_id] if source is not None else 0
        entry, host_n = (self.host.best(context, limit) if self.host is not None and reuse
                         else (None, 0))
        if entry is not None and host_n >= max(best_free_n, source_n) + restore_gain(entry):
            return Placement(spare, host_n, entry=entry)
        if source is not None and source_n > best_free_n:
            return Placement(best_free, source_n, source=source)
        return Placement(best_free, best_free_n)

    def _neighbours(self, slot: Slot) -> int:
        """With one KV stream per slot (`contiguous`), how many of `slot`'s two neighbours
        are running: a batch runs as one forward pass per run of consecutive slots
        (engine/llama.py), so a newcomer goes where it joins runs rather than where it
        starts one. 0 in the unified buffer, where placement costs no pass."""
        if not self.contiguous:
            return 0
        i = slot.seq_id
        return sum(1 for j in (i - 1, i + 1)
                   if 0 <= j < len(self.slots) and self.slots[j].owner is not None)

    def _place(self, seq: Sequence, kv: KVOps) -> None:
        """Give `seq` a free slot as `_choose` decides, with the cache edits that takes."""
        context = seq.context()
        where = self._choose(context, [s for s in self.slots if s.owner is None],
                             reuse=not seq.scores_prompt)
        slot = where.slot
        if where.entry is not None:
            self._keep(slot, 0, kv)
            kv.remove(slot.seq_id, 0)
            kv.restore(slot.seq_id, where.entry, where.reused)
            slot.tokens = where.entry.tokens[:where.reused]
        elif where.source is not None:
            self._keep(slot, 0, kv)
            kv.remove(slot.seq_id, 0)
            kv.copy(where.source.seq_id, slot.seq_id, 0, where.reused)
            slot.tokens = context[:where.reused]
        else:
            self._keep(slot, where.reused, kv)
            kv.remove(slot.seq_id, where.reused)
            del slot.tokens[where.reused:]
        slot.owner = seq
        seq.slot = slot.seq_id
        seq.n_fed = seq.reused = len(slot.tokens)
        if not seq.preemptions:
            seq.cached = min(seq.reused, len(seq.prompt))
        seq.state = SeqState.RUNNING

    def _keep(self, slot: Slot, kept: int, kv: KVOps) -> None:
        """`slot` loses its cells past `kept`: copy them to the host cache first when they
        hold enough that it lacks (engine/host_cache.py)."""
        if self.host is not None and len(slot.tokens) - kept >= MIN_SAVE \
                and self.host.wants(slot.tokens):
            kv.save(slot.seq_id, list(slot.tokens))

    def commit(self, batch: ScheduledBatch) -> None:
        """The decode ran: the fed tokens are now in the KV cache."""
        for seq, tokens in batch.fed:
            seq.n_fed += len(tokens)
            self.slots[seq.seq_id].tokens.extend(tokens)

    def reusable(self, context: list[int]) -> int:
        """How many leading tokens of `context` a sequence placed now would not compute:
        what `_choose` would reuse with a slot free; with none free (it waits), the longest
        prefix any slot or the host cache holds. Read from other threads for forecasts: a
        torn read only makes the answer a step stale."""
        if not self.prefix_reuse or not context:
            return 0
        free = [s for s in self.slots if s.owner is None]
        if free:
            return self._choose(context, free).reused
        limit = len(context) - 1
        held = max(min(common_prefix(s.tokens, context), limit) for s in self.slots)
        if self.host is not None and held < limit - MIN_RESTORE:  # else none is restored
            entry, host_n = self.host.best(context, limit)
            if entry is not None and host_n >= held + restore_gain(entry):
                held = host_n
        return held

    def idle_save(self) -> list[tuple[int, list[int]]]:
        """For an idle engine: one free slot's cells to copy to the host cache now (they
        stay in the slot too), so that trimming them later is a removal, not a copy on
        a newcomer's first step; [] when nothing is left worth copying."""
        if self.host is None or self.busy_cells is None:
            return []
        for slot in self.slots:
            if slot.owner is None and slot.saved != len(slot.tokens):
                slot.saved = len(slot.tokens)  # once, whatever the host cache keeps
                kv = KVOps()
                self._keep(slot, 0, kv)  # what a trim would copy: the same rule
                if kv.saves:
                    return kv.saves
        return []

    def cached_cells(self) -> int:
        """Cells that free slots keep for prefix reuse."""
        return sum(len(s.tokens) for s in self.slots if s.owner is None)

    def _trim(self, kv: KVOps, bound: int | None, before: float | None = None) -> None:
        """Keep free slots' cached prefixes within `bound` cells, forgetting the oldest
        (only slots freed before `before`, if given)."""
        if bound is None:
            return
        while self.cached_cells() > bound:
            seq_id = self.evict_oldest(kv, before)
            if seq_id is None:
                return
            kv.remove(seq_id, 0)

    def evict_oldest(self, kv: KVOps, before: float | None = None) -> int | None:
        """Forget the cached prefix of the free slot used longest ago (after `kv.saves`
        copies it to the host cache, if worth it); its seq id, or None when no free slot
        (freed before `before`, if given) holds any. The caller removes its cells."""
        held = [s for s in self.slots if s.owner is None and s.tokens
                and (before is None or s.last_used <= before)]
        if not held:
            return None
        slot = min(held, key=lambda s: s.last_used)
        self._keep(slot, 0, kv)
        slot.tokens = []
        self.evictions += 1
        return slot.seq_id

    def evict_free(self) -> list[int]:
        """Forget the cached KV of every free slot (when the cache is full)."""
        ids = []
        for slot in self.slots:
            if slot.owner is None and slot.tokens:
                slot.tokens = []
                ids.append(slot.seq_id)
        return ids
