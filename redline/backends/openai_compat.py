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

from redline.backends.base import Backend, BackendInfo
from redline.backends.http1 import Http1Connection, Http1Pool, UpstreamTimeout
from redline.backends.pool import PoolBackend
from redline.backends.sse import split_payloads
from redline.config import ModelConfig
from redline.errors import BackendError, ContextLengthExceeded, InvalidRequest
from redline.types import Chunk, FinishReason, GenerationRequest, StageTimings, Usage

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "eos": "stop",
                                    "abort": "cancelled", "error": "error"}
_TRANSPORT_ERRORS = (OSError, asyncio.TimeoutError, UpstreamTimeout, httptools.HttpParserError)


class OpenAICompatBackend:
    def __init__(self, name: str, url: str, *, upstream_model: str | None = None,
                 api_key: str | None = None, context_length: int = 4096, size_rank: int = 1,
                 connect_timeout_s: float = 2.0, ttft_timeout_s: float = 30.0,
                 read_timeout_s: float = 60.0) -> None:
        self.info = BackendInfo(name, "openai", context_length, size_rank)
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

    def _payload(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        s = request.sampling
        body: dict[str, Any] = {"model": self.upstream_model, "stream": True,
                                "stream_options": {"include_usage": True},
                                "max_tokens": s.max_tokens, "temperature": s.temperature,
                                "top_p": s.top_p}
        if s.stop:
            body["stop"] = list(s.stop)
        if s.seed is not None:
            body["seed"] = s.seed
        if s.top_k:
            body["top_k"] = s.top_k  # vLLM, SGLang, llama.cpp accept it; OpenAI does not need it
        if s.ignore_eos:
            body["ignore_eos"] = True
        if request.messages is not None:
            body["messages"] = [{"role": m.role, "content": m.content} for m in request.messages]
            return "/chat/completions", body
        body["prompt"] = request.prompt or ""
        return "/completions", body

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        # one generator from the socket to the chunk: every layer is a hop per token
        path, body = self._payload(request)
        data = json.dumps(body).encode()
        t0 = time.perf_counter()
        self.inflight += 1
        conn: Http1Connection | None = None
        ttft: float | None = None
        tokens = 0
        finish: FinishReason | None = None
        tail = ""  # text that came with the finish reason; sent with the last chunk
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
                                u = event["usage"]
                                usage = Usage(int(u.get("prompt_tokens") or 0),
                                              int(u.get("completion_tokens") or 0))
                            for choice in event.get("choices") or ():
                                text = _text(choice)
                                reason = choice.get("finish_reason")
                                if text:
                                    tokens += 1
                                    if ttft is None:
                                        ttft = time.perf_counter() - t0
                                if reason:
                                    finish = _FINISH.get(reason, "stop")
                                    tail += text
                                elif text:
                                    yield Chunk(text=text, tokens=1)
                    if conn.complete:
                        break
                    conn.relaying = tokens > 0
                    try:
                        await conn.wait()
                    except _TRANSPORT_ERRORS:
                        if done:  # the stream was whole; only its connection is not reusable
                            break
                        raise
            except (*_TRANSPORT_ERRORS, ValueError) as exc:  # ValueError: JSON, or a bad chunk
                if tokens == 0:
                    raise BackendError(f"{self.info.name}: upstream stream broke "
                                       f"({type(exc).__name__})") from exc
                yield Chunk(finish_reason="error",
                            error=f"upstream stream broke ({type(exc).__name__})")
                return
            end = time.perf_counter() - t0
            first = ttft if ttft is not None else end
            yield Chunk(text=tail, tokens=1 if tail else 0, finish_reason=finish or "stop",
                        usage=usage or Usage(0, tokens),
                        timings=StageTimings({"prefill": first, "decode": end - first}))
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


def _text(choice: dict[str, Any]) -> str:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return str(delta.get("content") or "")
    return str(choice.get("text") or "")


def _message(payload: Any) -> str:
    if isinstance(payload, dict):
        err = payload.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err)
        if err:
            return str(err)
        if "detail" in payload:
            return str(payload["detail"])
    return str(payload)[:200]


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
                                    read_timeout_s=cfg.read_timeout_s)
                for url in cfg.replica_urls()]
    if len(replicas) == 1:
        return replicas[0]
    return PoolBackend(cfg.name, replicas, cfg.placement, cfg.cache_blocks())
