"""Scheduler tests with made-up sequences: no model (the way vLLM tests its scheduler)."""

from __future__ import annotations

import asyncio

import pytest

from redline.engine.host_cache import MIN_NEW_TOKENS, HostCache
from redline.engine.scheduler import BUSY_IDLE_S, KVOps, Scheduler, common_prefix, restore_gain
from redline.engine.sequence import SeqState, Sequence
from redline.types import SamplingParams


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def make(loop, prompt, sid="s"):
    return Sequence(sid, list(prompt), SamplingParams(max_tokens=4, temperature=0), lambda c: None, loop)


def run_step(sched, sampled=7):
    """Schedule, pretend the decode ran, and append a token to each sampling sequence."""
    batch = sched.schedule()
    sched.commit(batch)
    for seq, _ in batch.samplers:
        seq.output.append(sampled)
    return batch


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0


def test_new_sequence_joins_running_batch_between_steps(loop):
    s = Scheduler(n_seq_max=4, n_batch=64)
    a = make(loop, range(10), "a")
    s.add(a)
    b1 = run_step(s)
    assert [e.seq_id for e in b1.entries] == [a.slot] * 10  # a's prefill
    b = make(loop, range(100, 105), "b")
    s.add(b)
    b2 = run_step(s)
    # a decodes one token while b prefills, in the same batch
    assert [e.seq_id for e in b2.entries].count(a.slot) == 1
    assert [e.seq_id for e in b2.entries].count(b.slot) == 5
    assert b2.entries[0].logits and b2.entries[0].seq_id == a.slot
    assert {seq.id for seq, _ in b2.samplers} == {"a", "b"}


def test_finished_sequence_leaves_and_frees_its_slot(loop):
    s = Scheduler(n_seq_max=1, n_batch=64)
    a, b = make(loop, [1, 2, 3], "a"), make(loop, [4, 5], "b")
    s.add(a)
    s.add(b)
    run_step(s)
    assert a.state is SeqState.RUNNING and b.state is SeqState.WAITING  # one slot only
    s.finish(a)
    batch = run_step(s)
    assert b.state is SeqState.RUNNING and all(e.seq_id == b.slot for e in batch.entries)


def test_cancelled_sequences_are_reaped_before_the_next_step(loop):
    s = Scheduler(n_seq_max=2, n_batch=64)
    a, b = make(loop, [1, 2, 3], "a"), make(loop, [4, 5, 6], "b")
    s.add(a)
    s.add(b)
    run_step(s)
    a.cancel()
    assert s.reap_cancelled() == [a]
    batch = run_step(s)
    assert all(e.seq_id == b.slot for e in batch.entries)
    assert s.slots[a.slot].owner is None


def test_chunked_prefill_respects_token_budget_and_decodes_first(loop):
    s = Scheduler(n_seq_max=2, n_batch=8)
    a = make(loop, range(3), "a")
    s.add(a)
    run_step(s)
    long = make(loop, range(50, 70), "long")
    s.add(long)
    batch = run_step(s)
    assert len(batch.entries) == 8
    assert batch.entries[0].seq_id == a.slot  # decode first
    assert long.n_fed == 7 and long.in_prefill
    assert all(seq.id != "long" for seq, _ in batch.samplers)  # no logits mid-prompt


def test_prefix_reuse_takes_the_free_slot_with_the_longest_shared_prefix(loop):
    s = Scheduler(n_seq_max=3, n_batch=64)
    system = list(range(40))
    a = make(loop, system + [100, 101], "a")
    s.add(a)
    run_step(s)
    s.finish(a)
    b = make(loop, system + [200, 201, 202], "b")
    s.add(b)
    batch = s.schedule()
    assert b.slot == a.slot
    assert b.reused == 40 and b.n_fed == 40
    assert batch.kv.removals == [(b.slot, 40)]  # drop only what differs
    assert len(batch.entries) == 3  # only the new suffix is computed


def test_a_trivial_shared_prefix_does_not_overwrite_a_valuable_one(loop):
    """Two questions that share only the chat template's first 3 tokens: the second goes
    to an empty slot, so the first's cached prompt is still there when it comes again;
    the template's cells are shared into the empty slot, not computed again."""
    s = Scheduler(n_seq_max=2, n_batch=64)
    template = [1, 2, 3]
    q1 = make(loop, template + list(range(100, 120)), "q1")
    s.add(q1)
    run_step(s)
    s.finish(q1)
    q2 = make(loop, template + list(range(200, 220)), "q2")
    s.add(q2)
    batch = s.schedule()
    assert q2.slot != q1.slot and q2.reused == 3
    assert batch.kv.order == [("remove", (q2.slot, 0)), ("copy", (q1.slot, q2.slot, 0, 3))]
    assert len(batch.entries) == 20
    s.commit(batch)
    s.finish(q2)
    again = make(loop, template + list(range(100, 118)) + [7, 7], "again")
    s.add(again)
    s.schedule()
    assert again.slot == q1.slot and again.reused == 21
    # no empty slot left: the one used longest ago, whatever little it shares
    s.finish(again)
    third = make(loop, template + list(range(300, 320)), "third")
    s.add(third)
    s.schedule()
    assert third.slot == q2.slot and third.reused == 3


def test_prefix_reuse_copies_from_a_running_sequence(loop):
    s = Scheduler(n_seq_max=3, n_batch=64)
    system = list(range(30))
    a = make(loop, system + [1], "a")
    s.add(a)
    run_step(s)
    b = make(loop, system + [2, 3], "b")
    s.add(b)
    batch = s.schedule()
    assert b.slot != a.slot
    assert (a.slot, b.slot, 0, 30) in batch.kv.copies
    assert b.reused == 30


def test_a_prompt_waits_for_the_shared_prefix_another_is_computing_then_copies_it(loop):
    # budget 64 a step: a's 200-token prompt takes 4 steps; b arrives during the first
    s = Scheduler(n_seq_max=4, n_batch=64)
    system = list(range(1000, 1190))
    a = make(loop, system + [1] * 10, "a")
    s.add(a)
    run_step(s)
    b = make(loop, system + [2, 3], "b")
    s.add(b)
    batch = run_step(s)
    assert b in s.waiting and b.slot is None  # not computing the same 190 tokens beside a
    assert all(seq is a for seq, _ in batch.fed)
    while a.n_fed < len(system):
        run_step(s)
    batch = s.schedule()
    assert b in s.running
    assert (a.slot, b.slot, 0, len(system)) in batch.kv.copies
    assert b.reused == len(system)


def test_a_short_or_small_shared_prefix_is_not_worth_waiting_for(loop):
    s = Scheduler(n_seq_max=4, n_batch=16)
    a = make(loop, list(range(100)), "a")
    s.add(a)
    run_step(s)
    b = make(loop, list(range(40)) + [7] * 60, "b")  # shares 40 of 100: less than half
    c = make(loop, list(range(20)) + [9], "c")  # shares 20: under MIN_WAIT_PREFIX
    s.add(b)
    s.add(c)
    run_step(s)
    assert b in s.running and c in s.running


def test_whole_prompt_cached_still_recomputes_last_token_for_logits(loop):
    s = Scheduler(n_seq_max=2, n_batch=64)
    a = make(loop, [5, 6, 7, 8], "a")
    s.add(a)
    run_step(s)
    s.finish(a)
    b = make(loop, [5, 6, 7, 8], "b")
    s.add(b)
    batch = s.schedule()
    assert b.reused == 3
    assert [e.token for e in batch.entries] == [8] and batch.entries[0].logits


def test_prefix_reuse_off_recomputes_everything(loop):
    s = Scheduler(n_seq_max=2, n_batch=64, prefix_reuse=False)
    a = make(loop, list(range(20)), "a")
    s.add(a)
    run_step(s)
    s.finish(a)
    b = make(loop, list(range(20)) + [99], "b")
    s.add(b)
    batch = s.schedule()
    assert b.reused == 0 and len(batch.entries) == 21


def finish_all(sched, seqs):
    """Run until every sequence has sampled once, then finish them in the order given."""
    while any(s.in_prefill for s in seqs):
        run_step(sched)
    for seq in seqs:
        sched.finish(seq)


def test_cells_kept_for_prefix_reuse_are_bounded_oldest_forgotten_first(loop):
    s = Scheduler(n_seq_max=4, n_batch=64, cache_cells=25)
    seqs = [make(loop, range(100 * i, 100 * i + 10), f"s{i}") for i in range(3)]
    for seq in seqs:
        s.add(seq)
    finish_all(s, seqs)  # s0 finishes first: its slot is the oldest
    assert s.cached_cells() == 30  # 3 × 10 prompt tokens
    batch = s.schedule()  # the bound is kept before the next step
    assert batch.kv.removals == [(seqs[0].slot, 0)]
    assert s.cached_cells() == 20 <= 25
    assert s.slots[seqs[0].slot].tokens == []
    assert len(s.slots[seqs[2].slot].tokens) == 10  # the newest keeps its prefix
    # and it is still reused: a prompt that shares it starts past it
    again = make(loop, list(range(200, 210)) + [1, 2], "again")
    s.add(again)
    s.schedule()
    assert again.slot == seqs[2].slot and again.reused == 10


def test_without_a_bound_nothing_is_forgotten_until_pressure(loop):
    s = Scheduler(n_seq_max=4, n_batch=64)
    seqs = [make(loop, range(100 * i, 100 * i + 10), f"s{i}") for i in range(3)]
    for seq in seqs:
        s.add(seq)
    finish_all(s, [seqs[1], seqs[0], seqs[2]])
    assert s.schedule().kv.removals == [] and s.cached_cells() == 30
    # pressure (the engine's decode found the KV full): oldest use first, one at a time
    assert s.evict_oldest(KVOps()) == seqs[1].slot
    assert s.evict_oldest(KVOps()) == seqs[0].slot
    assert s.evict_oldest(KVOps()) == seqs[2].slot
    assert s.evict_oldest(KVOps()) is None and s.evictions == 3


def test_cached_counts_the_first_placements_prompt_reuse_only(loop):
    s = Scheduler(n_seq_max=2, n_batch=64)
    system = list(range(20))
    a = make(loop, system + [100], "a")
    s.add(a)
    run_step(s)
    assert a.cached == 0  # nothing was cached before it
    s.finish(a)
    b = make(loop, system + [200, 201], "b")
    s.add(b)
    run_step(s)
    run_step(s)
    assert b.cached == 20 and b.output
    s.preempt(b)  # back in: its own cells give it prompt and output, a recomputation saved
    s.schedule()
    assert b.reused > 20 and b.cached == 20


# ---- the host prompt cache (engine/host_cache.py) -------------------------------------

def finish_after_prefill(sched, seq):
    while seq.in_prefill:
        batch = sched.schedule()
        sched.commit(batch)
    sched.finish(seq)


def test_host_cache_keeps_the_longest_match_and_evicts_least_recently_used():
    h = HostCache(capacity_bytes=300)
    a = h.put(list(range(100)), "A", 100)
    b = h.put([7] * 100, "B", 100)
    entry, n = h.best(list(range(80)) + [1, 2], limit=1000)
    assert entry is a and n == 80
    assert h.best([9] * 10, 1000) == (None, 0)
    assert h.best(list(range(100)), limit=40)[1] == 40
    h.used_for(a, 80)  # a is now the most recently used: b goes first
    h.put([8] * 100, "C", 100)
    h.put([6] * 100, "D", 100)
    assert h.best([7] * 100, 1000) == (None, 0) and b.payload is None
    assert h.best(list(range(100)), 1000)[0] is a
    assert h.used <= h.capacity and len(h) == 3
    assert h.put([5] * 100, "too big", 301) is None


def test_an_entry_that_extends_another_replaces_it_and_a_short_extension_is_not_saved():
    h = HostCache(capacity_bytes=10_000)
    h.put(list(range(200)), "A", 10)
    assert not h.wants(list(range(200 + MIN_NEW_TOKENS - 1)))  # too little that is new
    assert h.wants(list(range(200 + MIN_NEW_TOKENS)))
    longer = h.put(list(range(300)), "B", 20)
    assert len(h) == 1 and h.used == 20
    assert h.best(list(range(250)), 1000) == (longer, 250)
    assert not HostCache(0).wants(list(range(500)))


def test_a_forgotten_prefix_is_saved_then_restored_instead_of_recomputed(loop):
    host = HostCache(capacity_bytes=1 << 30)
    s = Scheduler(n_seq_max=2, n_batch=512, cache_cells=0, host=host)
    system = list(range(1000, 1300))
    a = make(loop, system + [1, 2], "a")
    s.add(a)
    finish_after_prefill(s, a)
    # free slots may keep no cells: the next step forgets a's and asks for a copy first
    b = make(loop, system + [3, 4], "b")
    s.add(b)
    batch = s.schedule()
    assert batch.kv.saves == [(a.slot, system + [1, 2])]
    host.put(system + [1, 2], "state of a", 1)  # what the engine does with the save
    # the slot was forgotten in this same step, before b was placed: nothing to restore
    # yet, so b computed its prompt (the engine saves before it removes)
    assert b.reused == 0 and not batch.kv.restores
    s.commit(batch)
    finish_after_prefill(s, b)
    c = make(loop, system + [5, 6], "c")
    s.add(c)
    batch = s.schedule()
    (seq_id, entry, keep), = batch.kv.restores
    assert seq_id == c.slot and entry.payload == "state of a" and keep == len(system)
    assert (c.slot, 0) in batch.kv.removals  # the slot is emptied before the copy comes back
    assert c.reused == c.cached == len(system)
    assert [e.token for e in batch.entries] == [5, 6]


def test_a_host_entry_is_restored_when_it_saves_more_than_its_copy_costs(loop):
    """Copying cells back costs microseconds a cell, a prompt token milliseconds: an entry
    that holds a few more tokens of the prompt than any slot is restored, and a long one
    only when it saves one token more per RESTORE_CELLS_PER_TOKEN cells it holds."""
    header = list(range(1000, 1024))  # the chat template's start, in every slot
    question = list(range(2000, 2026))
    context = header + question[:10] + [9]  # 10 more tokens in the entry than in a slot

    def placed(entry_tokens):
        host = HostCache(capacity_bytes=1 << 30)
        host.put(entry_tokens, "entry", 1)
        s = Scheduler(n_seq_max=2, n_batch=512, host=host)
        a = make(loop, header + [7, 8], "a")
        s.add(a)
        finish_after_prefill(s, a)  # its slot keeps the header
        b = make(loop, context, "b")
        s.add(b)
        return s.schedule(), b

    short = header + question + list(range(3000, 3064))
    batch, b = placed(short)
    (seq_id, entry, keep), = batch.kv.restores
    assert restore_gain(entry) == 4
    assert seq_id == b.slot and keep == 34 and b.reused == 34 and not batch.kv.copies
    assert [e.token for e in batch.entries] == [9]
    long = header + question + list(range(4000, 6000))  # 2,050 cells: 4 + 8 tokens needed
    batch, b = placed(long)
    assert not batch.kv.restores and b.reused == len(header)  # the header's slot, in place
    assert len(batch.entries) == 11


def test_a_prefix_still_in_a_slot_is_not_restored_from_the_host(loop):
    host = HostCache(capacity_bytes=1 << 30)
    host.put(list(range(1000, 1300)), "old", 1)
    s = Scheduler(n_seq_max=2, n_batch=512, host=host)
    a = make(loop, list(range(1000, 1300)) + [1], "a")
    s.add(a)
    finish_after_prefill(s, a)  # the slot keeps a's cells (no bound)
    b = make(loop, list(range(1000, 1300)) + [2], "b")
    s.add(b)
    batch = s.schedule()
    assert not batch.kv.restores and b.reused == 300 and host.restores == 0


def test_without_a_host_cache_nothing_is_saved(loop):
    s = Scheduler(n_seq_max=2, n_batch=512, cache_cells=0)
    a = make(loop, list(range(300)), "a")
    s.add(a)
    finish_after_prefill(s, a)
    s.add(make(loop, list(range(300)), "b"))
    batch = s.schedule()
    assert not batch.kv.saves and not batch.kv.restores
    assert s.evict_oldest(KVOps()) is None


def test_reusable_is_what_a_placement_would_not_compute(loop):
    """The forecast's view of the prefix cache (`reusable`) agrees with what `_place`
    then reuses: a slot's cells or a host entry, never the prompt's last token."""
    host = HostCache(capacity_bytes=1 << 30)
    s = Scheduler(n_seq_max=2, n_batch=512, host=host)
    system = list(range(1000, 1300))
    assert s.reusable(system + [9]) == 0  # nothing cached
    a = make(loop, system + [1, 2], "a")
    s.add(a)
    finish_after_prefill(s, a)  # its slot keeps its cells
    b_prompt = system + [3, 4]
    assert s.reusable(b_prompt) == len(system)
    assert s.reusable(system) == len(system) - 1  # the last token runs for its logits
    b = make(loop, b_prompt, "b")
    s.add(b)
    s.schedule()
    assert b.reused == len(system)  # what the forecast counted
    # a prompt only the host cache holds: the host entry counts
    other = list(range(5000, 5200))
    host.put(other + [7], "state", 1)
    assert s.reusable(other + [8]) == len(other)
    assert Scheduler(n_seq_max=2, n_batch=512, prefix_reuse=False).reusable(system) == 0


def test_host_cache_lookup_goes_by_blocks_and_forgets_dropped_entries():
    """`best` finds the deepest shared block through the index, then compares tokens: the
    answer is exact past the last whole block, and a dropped entry leaves no trace."""
    h = HostCache(capacity_bytes=1000)
    system = list(range(1000, 1400))
    entries = [h.put(system + [i] * 50, f"user {i}", 10) for i in range(20)]
    entry, n = h.best(system + [7] * 30 + [1], limit=10_000)
    assert entry is entries[7] and n == 430  # the system prompt and 30 of user 7's tokens
    entry, n = h.best(system + [99], limit=10_000)
    assert entry is not None and n == 400
    assert h.best(list(range(5)), 10_000) == (None, 0)  # not one whole block in common
    h.discard(entries[7])
    entry, n = h.best(system + [7] * 30 + [1], limit=10_000)
    assert entry is not entries[7] and n == 400
    for e in entries:
        h.discard(e)
    assert h.best(system, 10_000) == (None, 0) and not h._index


def test_a_prefix_is_copied_from_a_free_slot_before_the_next_newcomer_takes_it(loop):
    """Two newcomers in one step: the first copies 40 tokens from a free slot into an
    empty one, the second is then given that free slot and cuts its cells to what it
    shares. The edits are applied in the order they were made, so the copy reads the
    cells before the cut (removals first would copy cells already gone)."""
    s = Scheduler(n_seq_max=2, n_batch=512)
    a = make(loop, list(range(100)), "a")
    s.add(a)
    finish_after_prefill(s, a)
    y = make(loop, list(range(40)) + list(range(9000, 9100)), "y")  # 40 of 140 shared
    x = make(loop, list(range(3)) + list(range(5000, 5020)), "x")  # the template only
    s.add(y)
    s.add(x)
    batch = s.schedule()
    assert y.reused == 40 and y.slot != a.slot and x.slot == a.slot and x.reused == 3
    copy = batch.kv.order.index(("copy", (a.slot, y.slot, 0, 40)))
    cut = batch.kv.order.index(("remove", (a.slot, 3)))
    assert batch.kv.order.index(("remove", (y.slot, 0))) < copy < cut


def test_reusable_counts_what_placement_reuses(loop):
    """A free slot sharing less than half of a prompt is not taken (its prefix is worth
    more to the next request that shares it): an empty slot is, with the shared tokens'
    cells copied into it, and the forecast counts exactly that copy."""
    s = Scheduler(n_seq_max=2, n_batch=512)
    a = make(loop, list(range(100)), "a")
    s.add(a)
    finish_after_prefill(s, a)
    prompt = list(range(40)) + list(range(9000, 9100))  # shares 40 of 140 tokens with a's slot
    assert s.reusable(prompt) == 40
    b = make(loop, prompt, "b")
    s.add(b)
    batch = s.schedule()
    assert b.reused == 40 and b.slot != a.slot
    assert (a.slot, b.slot, 0, 40) in batch.kv.copies and not any(
        seq_id == a.slot for seq_id, _ in batch.kv.removals)  # a's 100 cells stay whole
    s.commit(batch)
    s.finish(b)
    # the same prompt sharing more than half: in place, counted alike
    c_prompt = list(range(90)) + [7, 7]
    assert s.reusable(c_prompt) == 90
    c = make(loop, c_prompt, "c")
    s.add(c)
    s.schedule()
    assert c.reused == 90 and c.slot == a.slot


def test_while_a_sequence_decodes_free_slots_keep_no_cells_past_the_busy_bound(loop):
    """Every decode step attends over all the cells in use: while anyone decodes, a free
    slot's cells go to the host cache once the slot has been free BUSY_IDLE_S (the same
    client's next request reuses them in place before that), and an idle engine keeps them."""
    host = HostCache(capacity_bytes=1 << 30)
    s = Scheduler(n_seq_max=3, n_batch=512, host=host, busy_cells=0)
    system = list(range(1000, 1100))
    a = make(loop, system + list(range(1, 60)), "a")
    s.add(a)
    finish_after_prefill(s, a)
    # nobody decodes: a's cells stay, and a newcomer takes what it shares with them
    b = make(loop, system + list(range(200, 320)), "b")  # less than half shared
    s.add(b)
    first = s.schedule()
    assert not first.kv.saves and (a.slot, 0) not in first.kv.removals
    assert b.reused == len(system) and b.slot != a.slot  # copied from a's slot
    s.commit(first)
    for q, _ in first.samplers:
        q.output.append(7)
    assert not b.in_prefill
    # b decodes now; a's slot was freed just now: kept a moment for a quick comeback
    assert not s.schedule().kv.removals
    s.slots[a.slot].last_used -= BUSY_IDLE_S  # ... and now it has been free long enough
    batch = s.schedule()
    assert batch.kv.saves == [(a.slot, system + list(range(1, 60)))]
    assert (a.slot, 0) in batch.kv.removals and s.slots[a.slot].tokens == []
    assert s.cached_cells() == 0
    # the engine goes idle: b's cells stay for the next request, whatever their age
    s.commit(batch)
    s.finish(b)
    s.slots[b.slot].last_used -= 10 * BUSY_IDLE_S
    assert not s.schedule().kv.removals
    assert s.cached_cells() == len(s.slots[b.slot].tokens) > len(system)


def test_without_a_busy_bound_free_slots_keep_their_cells_while_others_decode(loop):
    s = Scheduler(n_seq_max=3, n_batch=512)
    a = make(loop, range(100), "a")
    s.add(a)
    finish_after_prefill(s, a)
    s.slots[a.slot].last_used -= 10 * BUSY_IDLE_S
    b = make(loop, range(500, 600), "b")
    s.add(b)
    for _ in range(3):
        run_step(s)
    assert not b.in_prefill and s.cached_cells() == 100


def test_with_most_slots_busy_a_free_slot_keeps_its_cells_for_the_next_arrival(loop):
    """Under load a freed slot is taken again within a step or two: trimming it would only
    cost a copy to the host cache and the newcomer's in-place reuse."""
    host = HostCache(capacity_bytes=1 << 30)
    s = Scheduler(n_seq_max=3, n_batch=512, host=host, busy_cells=0)
    a = make(loop, range(100), "a")
    s.add(a)
    finish_after_prefill(s, a)
    s.slots[a.slot].last_used -= 10 * BUSY_IDLE_S
    b, c = make(loop, range(500, 600), "b"), make(loop, range(700, 800), "c")
    s.add(b)
    s.add(c)
    for _ in range(3):
        batch = run_step(s)
        assert not batch.kv.saves
    assert not b.in_prefill and not c.in_prefill and s.cached_cells() == 100


def test_a_newcomer_sees_the_same_cells_in_every_step_and_the_idle_engine_copies_first(loop):
    """Free slots past the busy bound are trimmed in the newcomer's own first step (after
    it took what it reuses), not halfway through its answer: identical greedy requests one
    after another then see the same KV layout. The idle engine copies free slots to the
    host cache beforehand, so that trim is a removal, not a copy on the first token's path."""
    host = HostCache(capacity_bytes=1 << 30)
    s = Scheduler(n_seq_max=3, n_batch=512, host=host, busy_cells=0)
    old = make(loop, range(300, 400), "old")
    s.add(old)
    finish_after_prefill(s, old)
    (seq_id, tokens), = s.idle_save()
    assert seq_id == old.slot and tokens == list(range(300, 400))
    host.put(tokens, "state of old", 1)  # what the engine does with it
    assert s.idle_save() == [] and s.slots[old.slot].tokens  # once; the cells stay
    s.slots[old.slot].last_used -= BUSY_IDLE_S
    a = make(loop, range(100), "a")
    s.add(a)
    first = s.schedule()
    assert [e.token for e in first.entries] == list(range(100))  # a's prompt, this step
    assert (old.slot, 0) in first.kv.removals and not first.kv.saves
    assert s.cached_cells() == 0


@pytest.mark.parametrize("contiguous", [False, True], ids=["unified", "per_slot"])
def test_with_a_stream_per_slot_a_newcomer_sits_beside_running_slots(loop, contiguous):
    """Four streams in slots 0-3 of 8; the one in slot 2 ends. A newcomer with nothing in
    common takes an empty slot in the unified buffer (slot 2's cells stay for a reuse),
    but beside running slots with a KV stream per slot (slot 2: the batch stays one run of
    consecutive slots, one forward pass, engine/llama.py)."""
    s = Scheduler(n_seq_max=8, n_batch=64)
    s.contiguous = contiguous
    seqs = [make(loop, range(100 * i, 100 * i + 5), f"s{i}") for i in range(4)]
    for q in seqs:
        s.add(q)
    run_step(s)
    assert [q.slot for q in seqs] == [0, 1, 2, 3]
    s.finish(seqs[2])
    new = make(loop, range(900, 905), "new")
    s.add(new)
    run_step(s)
    assert new.slot == (2 if contiguous else 4)
