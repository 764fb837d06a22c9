"""A streaming load generator for any OpenAI-compatible server.

Closed loop: `concurrency` workers, each sends its next request when the last one
ends. Open loop: requests arrive as a Poisson process at `rate` per second.
Each request records TTFT, inter-token latencies, E2E and output tokens.

The client is aiohttp: the load generator shares the machine with what it measures, and
per streamed chunk aiohttp (C parser) costs a fraction of httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from redline.backends.sse import data_payloads


@dataclass(frozen=True)
class Target:
    name: str
    url: str  # base URL, e.g. http://127.0.0.1:8000
    model: str
    api_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # merged into every body


@dataclass
class Sample:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    tokens: int = 0
    itl: list[float] = field(default_factory=list)
    error: str = ""
    text: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    stale: bool = False  # failed before any response: a closed keep-alive connection
    index: int = -1  # the request's number in its run (run_closed: the first `concurrency`
    # are sent together to an idle server; the later ones each as a client's answer ends)

    @property
    def tpot(self) -> float | None:
        return (self.e2e - self.ttft) / (self.tokens - 1) if self.tokens > 1 else None


@dataclass
class RunResult:
    target: str
    concurrency: int
    rate: float | None
    wall_s: float
    samples: list[Sample]


Body = dict[str, Any]


# a pooled keep-alive connection the server had closed: the request never reached it
STALE_CONNECTION = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


async def one_request(client: aiohttp.ClientSession, target: Target, body: Body) -> Sample:
    """One streamed request. A request sent on a pooled connection that the server had
    already closed (its keep-alive ran out; llama-server's does) is sent once more on a
    fresh one, as HTTP clients do for idempotent retries: a failure of the client's pool
    is not the server's. The time of the first try counts."""
    t0 = time.perf_counter()
    sample = await _one_request(client, target, body, t0)
    # the pool may hold as many connections the server closed as it has room for: each
    # failed try discards one (at 16 clients, 3 tries left llama-server's requests failed)
    pool = client.connector.limit if client.connector is not None else 0  # 0: no limit
    for _ in range(max(2, pool)):
        if sample.ok or not sample.stale:
            break
        sample = await _one_request(client, target, body, t0)
    return sample


async def _one_request(client: aiohttp.ClientSession, target: Target, body: Body,
                       t0: float) -> Sample:
    payload = {"model": target.model, "stream": True,
               "stream_options": {"include_usage": True}, **body, **target.extra}
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    sample = Sample(ok=False)
    last = None
    chunks = 0
    text: list[str] = []
    try:
        async with client.post(f"{target.url}/v1/chat/completions", json=payload,
                               headers=headers) as resp:
            sample.headers = {k.lower(): v for k, v in resp.headers.items()}
            if resp.status != 200:
                body_text = (await resp.read()).decode("utf-8", "replace")
                sample.error = f"HTTP {resp.status}: {body_text[:200]}"
                return sample
            done = False
            async for payloads in data_payloads(resp.content.iter_any()):
                if done:
                    continue  # read to the end: the connection goes back to the pool
                now = time.perf_counter()  # what came in one read arrived together
                for raw in payloads:
                    if raw == b"[DONE]":
                        done = True
                        break
                    obj = json.loads(raw)
                    if "error" in obj:
                        sample.error = str(obj["error"])
                        return sample
                    usage = obj.get("usage")
                    if usage:
                        sample.tokens = usage.get("completion_tokens", 0)
                    for choice in obj.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
                        if piece:
                            if last is None:
                                sample.ttft = now - t0
                            else:
                                sample.itl.append(now - last)
                            last = now
                            chunks += 1
                            text.append(piece)
        sample.e2e = time.perf_counter() - t0
        sample.tokens = sample.tokens or chunks
        sample.text = "".join(text)
        sample.ok = last is not None
        if not sample.ok:
            sample.error = "no tokens"
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        sample.error = f"{type(exc).__name__}: {exc}"
        sample.stale = isinstance(exc, STALE_CONNECTION) and not sample.headers
    return sample


@contextlib.contextmanager
def no_gc_pauses() -> Iterator[None]:
    """No cyclic garbage collection in the load generator while it measures: a full
    collection here stops every client for tens of ms, and that pause would be read as
    the server's latency (it was the direct baseline's p99 here). Reference counting
    still frees almost everything; the cycles wait for the end of the run."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def _session(connections: int, timeout: float) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout),
                                 connector=aiohttp.TCPConnector(limit=connections))


async def run_closed(target: Target, make_body: Callable[[int], Body], concurrency: int,
                     n_requests: int, timeout: float = 300.0,
                     samples: list[Sample] | None = None) -> RunResult:
    """`samples`: a list to collect into as requests end (a progress display reads it)."""
    samples = [] if samples is None else samples
    counter = iter(range(n_requests))
    async with _session(concurrency + 4, timeout) as client:
        async def worker() -> None:
            for i in counter:
                sample = await one_request(client, target, make_body(i))
                sample.index = i
                samples.append(sample)

        with no_gc_pauses():
            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            wall = time.perf_counter() - t0
    return RunResult(target.name, concurrency, None, wall, samples)


async def run_poisson(target: Target, make_body: Callable[[int], Body], rate: float,
                      n_requests: int, seed: int = 0, timeout: float = 300.0,
                      samples: list[Sample] | None = None) -> RunResult:
    rng = random.Random(seed)
    samples = [] if samples is None else samples
    async with _session(1000, timeout) as client:
        async def one(i: int) -> None:
            samples.append(await one_request(client, target, make_body(i)))

        tasks = []
        with no_gc_pauses():
            t0 = time.perf_counter()
            for i in range(n_requests):
                tasks.append(asyncio.create_task(one(i)))
                await asyncio.sleep(rng.expovariate(rate))
            await asyncio.gather(*tasks)
            wall = time.perf_counter() - t0
    return RunResult(target.name, 0, rate, wall, samples)
