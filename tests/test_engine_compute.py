"""The process's one compute thread (engine/compute.py): whatever thread asks, the work
runs on the same one, results and errors come back to the caller, and a call made on
that thread itself runs at once (no wait on itself)."""

from __future__ import annotations

import threading

import pytest

from redline.engine.compute import ComputeThread


def test_work_from_many_threads_runs_on_one() -> None:
    compute = ComputeThread()
    seen: list[int] = []
    results: list[int] = []
    lock = threading.Lock()

    def caller(i: int) -> None:
        for j in range(20):
            r = compute.run(lambda a, b: (seen.append(threading.get_ident()), a * b)[1], i, j)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted(i * j for i in range(4) for j in range(20))
    assert len(set(seen)) == 1
    assert seen[0] not in {t.ident for t in threads} | {threading.get_ident()}


def test_an_error_is_raised_in_the_caller_and_the_thread_goes_on() -> None:
    compute = ComputeThread()

    def fail() -> None:
        raise RuntimeError("llama_decode failed with 1 (KV cache full?)")

    with pytest.raises(RuntimeError, match="KV cache full"):
        compute.run(fail)
    assert compute.run(lambda: 7) == 7


def test_a_call_from_the_compute_thread_itself_runs_at_once() -> None:
    compute = ComputeThread()
    inner = compute.run(lambda: compute.run(threading.get_ident))
    assert inner == compute.run(threading.get_ident)
