"""Both bundled models in one process, as the default config runs them: their engines
share one StepArbiter, so their llama.cpp decodes never run at the same time, every
step runs on the process's one compute thread (one OpenMP team: engine/compute.py),
and each reports the other's work as its slowdown while both have some."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from redline.backends.local import LocalBackend
from redline.config import ModelConfig
from redline.engine import llama as llama_module
from redline.engine.arbiter import StepArbiter
from redline.engine.engine import Engine
from redline.types import GenerationRequest, Message, SamplingParams

pytestmark = pytest.mark.slow


def record_decodes(engine: Engine, spans: list[tuple[str, float, float]], name: str,
                   lock: threading.Lock) -> None:
    """Wrap the engine's llama_decode call to log when it ran."""
    decode = engine.runner.decode

    def timed(entries):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            decode(entries)
        finally:
            with lock:
                spans.append((name, t0, time.perf_counter()))

    engine.runner.decode = timed  # type: ignore[method-assign]


async def test_two_local_models_never_decode_at_once(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    decoded_on: set[int] = set()
    real_decode = llama_module.ll.llama_decode

    def on_thread(ctx, batch):  # type: ignore[no-untyped-def]
        decoded_on.add(threading.get_ident())
        return real_decode(ctx, batch)

    monkeypatch.setattr(llama_module.ll, "llama_decode", on_thread)
    arbiter = StepArbiter()
    models_dir = Path(".redline/models")
    smol = LocalBackend(ModelConfig(name="smol", bundled="smollm2-135m-instruct", n_threads=2,
                                    n_seq_max=4, n_ctx=512, warmup=False), models_dir, arbiter)
    gemma = LocalBackend(ModelConfig(name="gemma", bundled="gemma3-270m", chat_template="gemma",
                                     capabilities=["completions"], n_threads=2, n_seq_max=4,
                                     n_ctx=512, warmup=False), models_dir, arbiter)
    await asyncio.gather(smol.start(), gemma.start())
    spans: list[tuple[str, float, float]] = []
    lock = threading.Lock()
    assert smol.engine is not None and gemma.engine is not None
    engine_threads = {smol.engine._thread.ident, gemma.engine._thread.ident}
    record_decodes(smol.engine, spans, "smol", lock)
    record_decodes(gemma.engine, spans, "gemma", lock)
    scheduled_on: set[int] = set()
    for engine in (smol.engine, gemma.engine):
        schedule = engine.scheduler.schedule

        def on_schedule(schedule=schedule):  # type: ignore[no-untyped-def]
            scheduled_on.add(threading.get_ident())
            return schedule()

        engine.scheduler.schedule = on_schedule  # type: ignore[method-assign]
    slowdowns: list[float] = []
    try:
        def chat(q: str) -> GenerationRequest:
            return GenerationRequest(model="smol", messages=(Message("user", q),),
                                     sampling=SamplingParams(max_tokens=24, temperature=0.0,
                                                             ignore_eos=True))

        def text(p: str) -> GenerationRequest:
            return GenerationRequest(model="gemma", prompt=p,
                                     sampling=SamplingParams(max_tokens=24, temperature=0.0,
                                                             ignore_eos=True))

        async def drain(backend: LocalBackend, req: GenerationRequest) -> int:
            n = 0
            async for chunk in backend.stream(req):
                n += chunk.tokens
                slowdowns.append(backend.slowdown())
            return n

        jobs = [drain(smol, chat(q)) for q in ("What is 2 + 2?", "Name a colour.", "Say hi.")]
        jobs += [drain(gemma, text(p)) for p in ("The capital of France is", "Once upon a time")]
        counts = await asyncio.gather(*jobs)
        assert all(n == 24 for n in counts), counts
    finally:
        await asyncio.gather(smol.close(), gemma.close())
    assert {n for n, _, _ in spans} == {"smol", "gemma"}
    ordered = sorted(spans, key=lambda s: s[1])
    for (n1, s1, e1), (n2, s2, _) in zip(ordered, ordered[1:], strict=False):
        assert s2 >= e1, f"{n1} decoded {s1:.4f}-{e1:.4f} while {n2} started at {s2:.4f}"
    # the two took turns while both had work (not one after the other as a whole)
    switches = sum(1 for a, b in zip(ordered, ordered[1:], strict=False) if a[0] != b[0])
    assert switches >= 4
    assert arbiter.max_holders_seen == 1
    # one thread decoded for both engines, and it is neither engine's own thread
    assert len(decoded_on) == 1
    assert decoded_on.isdisjoint(engine_threads)
    # the steps' Python runs there too: no hand-off between a step and its pass
    assert scheduled_on == decoded_on
    assert 2.0 in slowdowns  # each saw the other's work while both had some


async def test_one_engine_stepping_alone_shows_its_cores_busy_as_it_goes() -> None:
    """With no other engine waiting, an engine's steps follow one another without handing
    the turn on (Engine._steps); the cores they use still show in `cores_busy` (the
    router's headroom for a dearer model) while the answer streams, not only after."""
    smol = LocalBackend(ModelConfig(name="smol", bundled="smollm2-135m-instruct", n_threads=2,
                                    n_seq_max=2, n_ctx=512, warmup=False),
                        Path(".redline/models"), StepArbiter())
    await smol.start()
    assert smol.engine is not None
    busy: list[float] = []
    try:
        req = GenerationRequest(model="smol", messages=(Message("user", "Count to fifty."),),
                                sampling=SamplingParams(max_tokens=48, temperature=0.0,
                                                        ignore_eos=True))
        async for chunk in smol.stream(req):
            if chunk.finish_reason is None:
                busy.append(smol.engine.cores_busy())
    finally:
        await smol.close()
    assert len(busy) >= 40
    assert max(busy[:-8]) > 0.0, busy
