"""One thread runs every llama.cpp forward pass in the process.

llama.cpp (built with OpenMP, as llama-cpp-python builds it) computes a graph with an
OpenMP team whose master is the thread that calls `llama_decode`, and every thread
that has been a master keeps a pool of its own. With two local models, two engine
threads made two pools; libgomp then counts more of its threads than cores and
throttles its spin-waits (`gomp_throttled_spin_count`), so each of the hundreds of
barriers in a forward pass sleeps and wakes through the kernel: one SmolLM2 stream
decoded at 16.9 ms a token beside an idle Qwen where it takes 10.6 ms alone (issue 23,
docs/BENCHMARKS.md). The step arbiter already lets one engine step at a time; this
makes them step on one thread, so the process has one team, whatever the number of
models (or of engines a test or bench builds).

`run(fn, *args)` calls `fn` on that thread and returns what it returns (or raises what
it raises); from that thread itself it is a plain call. An engine hands it whole runs
of steps, not single passes (`Engine._steps`): the steps' Python runs there too, so no
thread hand-off separates one pass from the next.

The one exception is a prompt computed on the side (engine/side.py): a second thread,
`side()`, computes one long prompt at a time in a context of its own while the compute
thread goes on decoding. The cores are then split, not shared: the side's team takes
`reserve(n)` threads, and every forward pass on the compute thread uses that many fewer
(`threads(n)`) until `release(n)`, so the process never has more compute threads than
cores.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class _Job:
    __slots__ = ("fn", "args", "result", "error", "done")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()


class ComputeThread:
    """A daemon thread that runs jobs one at a time, in the order they come."""

    def __init__(self, name: str = "llama-compute") -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> threading.Event:
        """Queue `fn(*args)` (its result and errors are the caller's to keep); the event is
        set once it has run."""
        job = _Job(fn, args)
        self._jobs.put(job)
        return job.done

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        if threading.current_thread() is self._thread:
            return fn(*args)
        job = _Job(fn, args)
        self._jobs.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        result: T = job.result
        return result

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job.result = job.fn(*job.args)
            except BaseException as exc:  # handed to the caller, which raises it
                job.error = exc
            job.done.set()


_shared: ComputeThread | None = None
_side: ComputeThread | None = None
_shared_lock = threading.Lock()
_reserved = 0  # threads the side's team holds now


def run(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on the process's one compute thread (started on first use)."""
    global _shared
    if _shared is None:
        with _shared_lock:
            if _shared is None:
                _shared = ComputeThread()
    return _shared.run(fn, *args)


def side() -> ComputeThread:
    """The process's one thread for prompts computed on the side (started on first use)."""
    global _side
    with _shared_lock:
        if _side is None:
            _side = ComputeThread("llama-side")
        return _side


def reserve(n: int) -> None:
    """The side's team takes `n` threads: passes on the compute thread use fewer."""
    global _reserved
    with _shared_lock:
        _reserved += n


def release(n: int) -> None:
    global _reserved
    with _shared_lock:
        _reserved = max(0, _reserved - n)


def reserved() -> int:
    return _reserved


def threads(wanted: int) -> int:
    """Threads for a pass on the compute thread that wants `wanted`: what the side leaves
    (at least one)."""
    return max(1, wanted - _reserved)
