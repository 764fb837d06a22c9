"""Any OpenAI-compatible engine (vLLM, SGLang, TGI, Ollama, llama.cpp's server, OpenAI)
as a backend, streamed over HTTP/1.1 keep-alive connections (backends/http1.py).

Closing the stream closes the upstream response, so the engine sees its client go and
stops generating: a client that leaves, or a hedge that loses, costs the upstream nothing
more. Errors before the first token are raised as redline errors (BackendError is
retryable, InvalidRequest is the user's); after it, the stream ends with an error chunk.

Why not httpx: relaying tokens is most of a gateway's work, and per SSE chunk httpx
(httpcore + h11 in Python, an anyio cancel scope around every read) cost several times
what a C parser and one read timer per connection do; httpcore's pool also scanned every
pooled connection on each request (half the CPU at 64 streams). Why not aiohttp (used
until stop 15): see backends/http1.py (trips through the event loop before the first token).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httptools

from redline.backends import openai_wire as wire
from redline.backends.base import Backend, BackendInfo
from redline.backends.http1 import Http1Connection, Http1Pool, UpstreamTimeout
from redline.backends.openai_wire import request_body
from redline.backends.pool import PoolBackend
from redline.backends.sse import split_payloads
from redline.config import ModelConfig
from redline.errors import BackendError, ContextLengthExceeded, InvalidRequest
from redline.types import Chunk, GenerationRequest, StageTimings, Usage

_TRANSPORT_ERRORS = (OSError, asyncio.TimeoutError, UpstreamTimeout, httptools.HttpParserError)
# `priority` per tier, S first: vLLM serves lower values first, SGLang higher by default
PRIORITY = {"lower-first": {"S": 0, "A": 1, "B": 2}, "higher-first": {"S": 2, "A": 1, "B": 0}}


class OpenAICompatBackend:
    def __init__(self, name: str, url: str, *, upstream_model: str | None = None,
                 api_key: str | None = None, context_length: int = 4096, size_rank: int = 1,
                 connect_timeout_s: float = 2.0, ttft_timeout_s: float = 30.0,
                 read_timeout_s: float = 60.0, priority: str = "off") -> None:
        self.info = BackendInfo(name, "openai", context_length, size_rank)
        # the engine schedules by priority (config `upstream_priority`): tier -> its value
        self.priority = PRIORITY.get(priority)
        self.base = url.rstrip("/")
        if not self.base.endswith("/v1"):
            self.base += "/v1"
        self.upstream_model = upstream_model or name
        # one read timeout between chunks; the first token may take longer than later ones
        self.pool = Http1Pool(self.base, connect_timeout_s=connect_timeout_s,
                              read_timeout_s=max(ttft_timeout_s, read_timeout_s))
        self._auth = f"Authorization: Bearer {api_key}\r\n".encode() if api_key else b""
        self.inflight = 0

    async def start(self) -> None:
        return None  # a remote engine is up or not; the breaker learns which

    async def close(self) -> None:
        self.pool.close()

    def load(self) -> int:
        return self.inflight

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        # one generator from the socket to the chunk: every layer is a hop per token
        path, body = request_body(request, self.upstream_model)
        if self.priority is not None and request.tier is not None:
            body["priority"] = self.priority[request.tier]  # the tier redline grants wins
        data = json.dumps(body).encode()
        t0 = time.perf_counter()
        self.inflight += 1
        conn: Http1Connection | None = None
        ttft: float | None = None
        tokens = 0
        # the last choice end seen: the stream's last chunk if nothing follows it, else
        # (several choices) sent on as that choice's end when more comes
        held: Chunk | None = None
        usage: Usage | None = None
        try:
            message = self.pool.request_head(path, len(data), self._auth) + data
            for fresh in (False, True):
                try:
                    conn = await self.pool.acquire(fresh=fresh)
                except _TRANSPORT_ERRORS as exc:
                    raise BackendError(f"{self.info.name}: upstream unreachable "
                                       f"({type(exc).__name__})") from exc
                # sent from this step: no trip through the event loop before the upstream has it
                conn.send(message)
                try:
                    await conn.wait()  # body bytes (or the end): the head alone wakes no one
                    break
                except _TRANSPORT_ERRORS as exc:
                    conn.close()
                    # a kept-alive connection that the upstream closed as we sent: once more
                    # on a new one (nothing came back, so nothing was answered)
                    if conn.uses > 1 and not conn.received and isinstance(exc, ConnectionError):
                        continue
                    raise BackendError(f"{self.info.name}: upstream gave no answer "
                                       f"({type(exc).__name__})") from exc
            assert conn is not None
            if conn.status >= 400:
                try:
                    raw = conn.take()
                    raw.append(b"" if conn.complete else await conn.read_all())
                except _TRANSPORT_ERRORS:
                    pass
                raise _upstream_error(self.info.name, conn.status, b"".join(raw))
            pending = b""
            done = False
            try:
                # after [DONE], read on to the end of the body so the connection is reused
                while True:
                    # read before taking: a body that ended while this loop yielded has its
                    # last bytes taken on the next pass, not left behind
                    complete = conn.complete
                    for received in conn.take():
                        if done:
                            continue
                        payloads, pending = split_payloads(pending, received)
                        for payload in payloads:
                            if payload == b"[DONE]":
                                done = True
                                break
                            event = _decode(payload)
                            if "error" in event and not event.get("choices"):
                                raise BackendError(f"{self.info.name}: {_message(event)}")
                            if event.get("usage"):
                                usage = wire.usage(event["usage"])
                            for choice in event.get("choices") or ():
                                chunk = _chunk(choice)
                                if chunk is None:
                                    continue
                                if chunk.tokens:
                                    tokens += chunk.tokens
                                    if ttft is None:
                                        ttft = time.perf_counter() - t0
                                if held is not None:
                                    held.ends_choice, held.finish_reason = held.finish_reason, None
                                    yield held
                                    held = None
                                if chunk.finish_reason is not None:
                                    held = chunk
                                else:
                                    yield chunk
                    if complete:
                        break
                    conn.relaying = tokens > 0
                    try:
                        await conn.wait()
                    except _TRANSPORT_ERRORS:
                        if done:  # the stream was whole; only its connection is not reusable
                            break
                        raise
            except (*_TRANSPORT_ERRORS, ValueError, KeyError, TypeError) as exc:  # a bad chunk
                if tokens == 0:
                    raise BackendError(f"{self.info.name}: upstream stream broke "
                                       f"({type(exc).__name__})") from exc
                yield Chunk(finish_reason="error",
                            error=f"upstream stream broke ({type(exc).__name__})")
                return
            end = time.perf_counter() - t0
            first = ttft if ttft is not None else end
            last = held or Chunk(finish_reason="stop")
            last.usage = usage or Usage(0, tokens)
            last.timings = StageTimings({"prefill": first, "decode": end - first})
            yield last
        finally:
            self.inflight -= 1
            if conn is not None:
                # read to its end: back to the pool; left early: closed, and the upstream,
                # seeing the connection go, stops generating
                self.pool.release(conn)


_raw_decode = json.JSONDecoder().raw_decode


def _decode(payload: bytes) -> Any:
    """json.loads for one SSE payload (stripped), at half its cost per relayed token:
    no encoding detection, no whitespace skipping."""
    text = payload.decode()
    value, end = _raw_decode(text)
    if end != len(text):
        raise ValueError("extra data after the JSON value")
    return value


def _chunk(choice: dict[str, Any]) -> Chunk | None:
    """One streamed choice as a chunk (None: nothing in it, e.g. the role alone)."""
    delta = choice.get("delta")
    reason = choice.get("finish_reason")
    if reason is None and choice.get("logprobs") is None and type(delta) is dict \
            and len(delta) == 1 and type(text := delta.get("content")) is str:
        # the common relayed token: a text delta alone (what the general path below
        # would make of it, without its per-field parsing)
        return Chunk(text=text, tokens=1, index=int(choice.get("index") or 0)) if text else None
    finish = wire.FINISH.get(reason, "stop") if reason else None
    lps = wire.logprobs(choice.get("logprobs"))
    if isinstance(delta, dict):
        text = delta.get("content") or ""
        chunk = Chunk(text=text, index=int(choice.get("index") or 0),
                      reasoning=delta.get("reasoning_content") or "",
                      tool_calls=wire.tool_call_deltas(delta.get("tool_calls")), logprobs=lps,
                      finish_reason=finish, extra=wire.delta_extra(delta))
    else:
        chunk = Chunk(text=choice.get("text") or "", index=int(choice.get("index") or 0),
                      logprobs=lps, finish_reason=finish)
    if not (chunk.has_delta or finish):
        return None
    # a fragment is about a token (a server may pack several: the count is for progress)
    chunk.tokens = 1 if chunk.has_delta else 0
    return chunk


def _message(payload: Any) -> str:
    return wire.error_message(payload) or str(payload)[:200]


def _upstream_error(name: str, status: int, raw: bytes) -> Exception:
    try:
        payload: Any = json.loads(raw)
    except ValueError:
        payload = raw[:200].decode("utf-8", "replace")
    msg = _message(payload)
    if status == 400:
        code = payload.get("error", {}).get("code") if isinstance(payload, dict) and isinstance(
            payload.get("error"), dict) else None
        if code == "context_length_exceeded" or "context length" in msg.lower():
            return ContextLengthExceeded(msg, param="messages")
        return InvalidRequest(msg)
    # 401/403/404 are our configuration's fault, 429/5xx the engine's: all retryable elsewhere
    return BackendError(f"{name}: upstream answered {status}: {msg}")


def from_config(cfg: ModelConfig) -> Backend:
    """One backend per replica url; several form a pool (placed by `cfg.placement`)."""
    replicas = [OpenAICompatBackend(cfg.name, url, upstream_model=cfg.upstream_model,
                                    api_key=cfg.api_key, context_length=cfg.n_ctx,
                                    size_rank=cfg.size_rank, connect_timeout_s=cfg.connect_timeout_s,
                                    ttft_timeout_s=cfg.ttft_timeout_s,
                                    read_timeout_s=cfg.read_timeout_s,
                                    priority=cfg.upstream_priority)
                for url in cfg.replica_urls()]
    if len(replicas) == 1:
        return replicas[0]
    return PoolBackend(cfg.name, replicas, cfg.placement, cfg.cache_blocks(), cfg.load_cost_tokens())
