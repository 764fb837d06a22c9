"""Replica placement with made-up requests: the pure ranking, the prefix index, and the
pool's choice (prefix hit against bounded load, session pins) on fake replicas."""

from __future__ import annotations

import random

import pytest

from redline.backends.fake import FakeBackend
from redline.backends.placement import Weights, affinity, load_cap, rank
from redline.backends.pool import PoolBackend
from redline.backends.prefix_index import PrefixIndex, prompt_text, text_blocks
from redline.config import ModelConfig, PlacementConfig
from redline.types import GenerationRequest, Message, SamplingParams

W = Weights(load_bound=1.25, load_cost_blocks=16.0)


def chat(system: str, user: str, *, tenant: str = "t", session: str | None = None,
         user_id: str | None = None) -> GenerationRequest:
    return GenerationRequest(model="m", sampling=SamplingParams(max_tokens=4), tenant=tenant,
                             session=session, user=user_id,
                             messages=(Message("system", system), Message("user", user)))


def system_prompt(tenant: int, words: int = 300) -> str:
    rng = random.Random(tenant)
    return " ".join(f"w{rng.randrange(10_000)}" for _ in range(words))


# -- the pure ranking -----------------------------------------------------------------

def test_prefix_prefers_the_replica_that_holds_the_prompt() -> None:
    # replica 2 holds 40 blocks of the prompt and has one request in flight: it beats the idle ones
    assert rank("prefix", loads=[0, 0, 1], hits=[0, 0, 40], turn=0, weights=W)[0] == 2


def test_prefix_weighs_a_small_hit_against_load() -> None:
    # 2 blocks held do not pay for one more request in flight (16 blocks' worth)
    assert rank("prefix", loads=[1, 0], hits=[2, 0], turn=0, weights=W)[0] == 1
    # 20 blocks do
    assert rank("prefix", loads=[1, 0], hits=[20, 0], turn=0, weights=W)[0] == 0


def test_bounded_load_skips_a_replica_above_the_bound_however_good_its_hit() -> None:
    loads, hits = [5, 0, 0, 0], [60, 0, 0, 0]
    assert load_cap(loads, 1.25) == 2  # 1.25 x (5 + 1) / 4, rounded up
    order = rank("prefix", loads, hits, turn=0, weights=W)
    assert order[0] != 0 and order[-1] == 0  # tried last, not never
    # with a looser bound the hit wins again
    assert rank("prefix", loads, hits, turn=0, weights=Weights(8.0, 0.0))[0] == 0


def test_the_least_loaded_replica_is_always_under_the_bound() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        loads = [rng.randrange(50) for _ in range(rng.randrange(1, 20))]
        bound = rng.choice([1.0, 1.1, 1.25, 2.0])
        assert min(loads) + 1 <= load_cap(loads, bound)
        order = rank("prefix", loads, [rng.randrange(80) for _ in loads], rng.randrange(100),
                     Weights(bound, 16.0))
        assert sorted(order) == list(range(len(loads)))  # every replica, once
        assert loads[order[0]] + 1 <= load_cap(loads, bound)


def test_ties_rotate_so_new_prefixes_spread() -> None:
    firsts = {rank("prefix", [0, 0, 0, 0], [0, 0, 0, 0], turn=t, weights=W)[0] for t in range(4)}
    assert firsts == {0, 1, 2, 3}


def test_least_loaded_ignores_hits_and_round_robin_ignores_loads() -> None:
    assert rank("least_loaded", loads=[2, 1, 3], hits=[50, 0, 0], turn=0, weights=W)[0] == 1
    assert [rank("round_robin", [9, 0, 0], [0, 0, 0], turn=t, weights=W)[0] for t in range(3)] == [0, 1, 2]
    assert rank("prefix", [], [], 0, W) == []


# -- the prefix index ----------------------------------------------------------------

def test_index_matches_the_longest_held_run_from_the_start() -> None:
    idx = PrefixIndex(capacity=100)
    idx.add(text_blocks("a" * 64 * 5, 64))
    assert idx.match(text_blocks("a" * 64 * 5, 64)) == 5
    assert idx.match(text_blocks("a" * 64 * 3 + "b" * 64 * 2, 64)) == 3
    # the same block after a different start is another prefix: chained hashes tell them apart
    assert idx.match(text_blocks("b" * 64 + "a" * 64 * 4, 64)) == 0
    assert text_blocks("a" * 63, 64) == []  # a partial block is not cached


def test_index_evicts_least_recent_and_a_prefix_head_last() -> None:
    idx = PrefixIndex(capacity=4)
    one = text_blocks("x" * 64 * 3, 64)
    idx.add(one)
    idx.add(text_blocks("y" * 64 * 2, 64))  # 5 blocks seen, 4 held: one of `one` went
    assert len(idx) == 4
    assert idx.match(one) == 2  # its tail went first, its head is still there
    with pytest.raises(ValueError):
        PrefixIndex(0)


def test_chat_turn_boundaries_are_part_of_the_prompt() -> None:
    a = chat("You are helpful.", "hi")
    b = GenerationRequest(model="m", sampling=SamplingParams(),
                          messages=(Message("system", "You are helpful.hi"),))
    assert prompt_text(a) != prompt_text(b)


# -- the pool on fake replicas -------------------------------------------------------

def pool_of(n: int, **placement: object) -> tuple[PoolBackend, list[FakeBackend]]:
    reps = [FakeBackend(f"r{i}") for i in range(n)]
    return PoolBackend("m", reps, PlacementConfig(**placement), cache_blocks=4096), reps  # type: ignore[arg-type]


def send(pool: PoolBackend, request: GenerationRequest) -> int:
    chosen = pool.pick(request=request)
    assert chosen is not None
    pool.record(chosen, request)
    return pool.replicas.index(chosen)


def test_a_tenants_requests_return_to_the_replica_that_holds_its_prompt() -> None:
    pool, _ = pool_of(4)
    first = {t: send(pool, chat(system_prompt(t), "first question")) for t in range(16)}
    assert len(set(first.values())) >= 3  # new prefixes spread over the replicas (homes)
    for round_ in range(3):
        for t in range(16):
            assert send(pool, chat(system_prompt(t), f"question {round_}")) == first[t]


def test_other_policies_do_not_follow_the_prefix() -> None:
    for policy in ("least_loaded", "round_robin"):
        pool, _ = pool_of(4, policy=policy)
        seen = {send(pool, chat(system_prompt(1), f"q{i}")) for i in range(8)}
        assert len(seen) == 4


def test_a_hot_prefix_spills_over_when_its_replica_is_above_the_bound() -> None:
    pool, reps = pool_of(4)
    home = send(pool, chat(system_prompt(1), "q"))
    reps[home].inflight = 6  # busy with that tenant's traffic
    for r in reps:
        if r is not reps[home]:
            r.inflight = 1
    # cap = ceil(1.25 x (9 + 1) / 4) = 4: the home replica is over it
    spill = send(pool, chat(system_prompt(1), "another"))
    assert spill != home
    holders = {reps[home], reps[spill]}  # the prefix is on both now
    for r in reps:  # back under the bound (cap 4): the prefix wins over one more in flight
        r.inflight = 3 if r in holders else 2
    assert pool.pick(request=chat(system_prompt(1), "third")) in holders


def test_a_session_stays_on_its_replica_while_it_is_usable() -> None:
    pool, reps = pool_of(3)
    where = send(pool, chat("short", "hello", session="s-1"))
    for i in range(6):  # unrelated prompts, no shared prefix: the session decides
        assert send(pool, chat(f"other {i}", f"turn {i}", session="s-1")) == where
    # the same session id under another tenant is another session: it goes to the least
    # loaded, while the first stays pinned although its replica is busier
    reps[where].inflight = 1
    assert send(pool, chat("x", "y", tenant="u", session="s-1")) != where
    assert send(pool, chat("x", "y", session="s-1")) == where
    reps[where].inflight = 0
    # its replica's breaker is open: it moves, and stays where it moved
    down = reps[where]
    moved = pool.pick(usable=lambda r: r is not down, request=chat("z", "z", session="s-1"))
    assert moved is not None and moved is not down
    pool.record(moved, chat("z", "z", session="s-1"))
    assert pool.pick(request=chat("w", "w", session="s-1")) is moved


def test_the_openai_user_field_is_a_session_key_and_sessions_can_be_off() -> None:
    pool, _ = pool_of(3)
    where = send(pool, chat("a", "b", user_id="alice"))
    assert all(send(pool, chat(f"c{i}", "d", user_id="alice")) == where for i in range(5))
    off, _ = pool_of(3, sessions=False)
    assert len({send(off, chat(f"c{i}", "d", user_id="alice")) for i in range(6)}) > 1


def test_sessions_are_forgotten_oldest_first_at_capacity() -> None:
    pool, _ = pool_of(2, session_capacity=2)
    for s in ("a", "b", "c"):
        send(pool, chat("p", "q", session=s))
    assert len(pool.sessions) == 2 and all(k.endswith(("b", "c")) for k in pool.sessions)


def test_config_sizes_the_index_like_the_engine_cache() -> None:
    local = ModelConfig(name="m", bundled="x", n_ctx=2048, n_seq_max=8)
    assert local.cache_blocks() == 2048 * 8 // 16
    remote = ModelConfig(name="m", backend="openai", urls=["http://a", "http://b"],
                         placement={"cache_blocks": 500, "policy": "round_robin"})  # type: ignore[arg-type]
    assert remote.cache_blocks() == 500 and remote.placement.policy == "round_robin"
    with pytest.raises(ValueError):
        PlacementConfig(load_bound=0.5)


def test_a_new_prefix_goes_home_by_rendezvous_hashing_within_the_bound() -> None:
    homes = [affinity((12345).to_bytes(8, "little"), i) for i in range(4)]
    best = max(range(4), key=lambda i: homes[i])
    # seen nowhere: its home, whatever the loads (below the bound) and the turn
    assert all(rank("prefix", [1, 0, 1, 0], [0] * 4, turn=t, weights=W, homes=homes)[0] == best
               for t in range(4))
    loads = [0] * 4
    loads[best] = 5  # above the bound: the next home
    second = max((i for i in range(4) if i != best), key=lambda i: homes[i])
    assert rank("prefix", loads, [0] * 4, turn=0, weights=W, homes=homes)[0] == second
    # seen somewhere: the hit decides, not the home
    hits = [0] * 4
    hits[second] = 30
    assert rank("prefix", [0] * 4, hits, turn=0, weights=W, homes=homes)[0] == second


def test_homes_spread_prefixes_evenly() -> None:
    counts = [0] * 8
    for anchor in range(4000):
        key = (anchor * 7919).to_bytes(8, "little")
        counts[max(range(8), key=lambda i: affinity(key, i))] += 1
    assert min(counts) > 400 and max(counts) < 600  # 500 each, give or take


def test_two_gateways_with_their_own_index_place_a_new_prefix_alike() -> None:
    a, _ = pool_of(4)
    b, _ = pool_of(4)
    for t in range(12):
        req = chat(system_prompt(t), "hello")
        assert send(a, req) == send(b, chat(system_prompt(t), "other"))


def test_a_local_model_with_replicas_is_a_pool_of_engines(tmp_path: object) -> None:
    from pathlib import Path

    from redline.api.services import build_backend
    from redline.backends.local import LocalBackend

    cfg = ModelConfig(name="m", bundled="smollm2-135m-instruct", replicas=3, n_ctx=1024, n_seq_max=4)
    pool = build_backend(cfg, Path(str(tmp_path)))  # nothing loads before start()
    assert isinstance(pool, PoolBackend) and len(pool.replicas) == 3
    assert all(isinstance(r, LocalBackend) for r in pool.replicas)
    assert len({id(r) for r in pool.replicas}) == 3
    assert pool.indexes[0].capacity == 1024 * 4 // 16
    single = build_backend(ModelConfig(name="m", bundled="smollm2-135m-instruct"), Path(str(tmp_path)))
    assert isinstance(single, LocalBackend)
