"""Any OpenAI-compatible engine (vLLM, SGLang, TGI, Ollama, llama.cpp's server, OpenAI)
as a backend, streamed over aiohttp.

Closing the stream closes the upstream response, so the engine sees its client go and
stops generating: a client that leaves, or a hedge that loses, costs the upstream nothing
more. Errors before the first token are raised as redline errors (BackendError is
retryable, InvalidRequest is the user's); after it, the stream ends with an error chunk.

Why aiohttp and not httpx: relaying tokens is most of a gateway's work, and per SSE
chunk httpx (httpcore + h11 in Python, an anyio cancel scope around every read) cost
several times what aiohttp's C parser and plain read timer do; httpcore's pool also
scanned every pooled connection on each request (half the CPU at 64 streams).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from yarl import URL

from redline.backends.base import Backend, BackendInfo
from redline.backends.pool import PoolBackend
from redline.backends.sse import split_payloads
from redline.config import ModelConfig
from redline.errors import BackendError, ContextLengthExceeded, InvalidRequest
from redline.types import Chunk, FinishReason, GenerationRequest, StageTimings, Usage

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "eos": "stop",
                                    "abort": "cancelled", "error": "error"}
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
_JSON = {"Content-Type": "application/json"}


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
        # parsed once: aiohttp would parse a str URL on every request
        self._urls = {"chat": URL(f"{self.base}/chat/completions"),
                      "text": URL(f"{self.base}/completions")}
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # one read timeout between chunks; the first token may take longer than later ones
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s,
                                              sock_read=max(ttft_timeout_s, read_timeout_s))
        self._session: aiohttp.ClientSession | None = None  # made in the serving loop
        self.inflight = 0

    async def start(self) -> None:
        return None  # a remote engine is up or not; the breaker learns which

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def load(self) -> int:
        return self.inflight

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # no connection limit here: admission control and tiers bound the load
            self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0),
                auto_decompress=False)
        return self._session

    def _payload(self, request: GenerationRequest) -> tuple[URL, dict[str, Any]]:
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
            return self._urls["chat"], body
        body["prompt"] = request.prompt or ""
        return self._urls["text"], body

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        # one generator from the socket to the chunk: every layer is a hop per token
        url, body = self._payload(request)
        t0 = time.perf_counter()
        self.inflight += 1
        response: aiohttp.ClientResponse | None = None
        complete = False
        ttft: float | None = None
        tokens = 0
        finish: FinishReason | None = None
        tail = ""  # text that came with the finish reason; sent with the last chunk
        usage: Usage | None = None
        try:
            try:
                response = await self._client().post(url, data=json.dumps(body).encode(),
                                                     headers=_JSON)
            except _TRANSPORT_ERRORS as exc:
                raise BackendError(f"{self.info.name}: upstream unreachable "
                                   f"({type(exc).__name__})") from exc
            if response.status >= 400:
                raise await _upstream_error(self.info.name, response)
            content = response.content
            pending = b""
            done = False
            try:
                # after [DONE], read on to the end of the body so the connection is reused
                while data := await content.readany():
                    if done:
                        continue
                    payloads, pending = split_payloads(pending, data)
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
            except (*_TRANSPORT_ERRORS, ValueError) as exc:  # ValueError: JSON, or a bad chunk
                if tokens == 0:
                    raise BackendError(f"{self.info.name}: upstream stream broke "
                                       f"({type(exc).__name__})") from exc
                yield Chunk(finish_reason="error",
                            error=f"upstream stream broke ({type(exc).__name__})")
                return
            end = time.perf_counter() - t0
            first = ttft if ttft is not None else end
            complete = True
            yield Chunk(text=tail, tokens=1 if tail else 0, finish_reason=finish or "stop",
                        usage=usage or Usage(0, tokens),
                        timings=StageTimings({"prefill": first, "decode": end - first}))
        finally:
            self.inflight -= 1
            if response is not None:
                if complete and response.content.at_eof():
                    response.release()  # the connection goes back to the pool
                else:
                    response.close()  # upstream sees the disconnect and stops


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


async def _upstream_error(name: str, response: aiohttp.ClientResponse) -> Exception:
    try:
        raw = await response.read()
    except _TRANSPORT_ERRORS:
        raw = b""
    try:
        payload: Any = json.loads(raw)
    except ValueError:
        payload = raw[:200].decode("utf-8", "replace")
    msg = _message(payload)
    status = response.status
    if status == 400:
        code = payload.get("error", {}).get("code") if isinstance(payload, dict) and isinstance(
            payload.get("error"), dict) else None
        if code == "context_length_exceeded" or "context length" in msg.lower():
            return ContextLengthExceeded(msg, param="messages")
        return InvalidRequest(msg)
    # 401/403/404 are our configuration's fault, 429/5xx the engine's: all retryable elsewhere
    return BackendError(f"{name}: upstream answered {status}: {msg}")


def from_config(cfg: ModelConfig) -> Backend:
    """One backend per replica url; several form a least-outstanding-requests pool."""
    replicas = [OpenAICompatBackend(cfg.name, url, upstream_model=cfg.upstream_model,
                                    api_key=cfg.api_key, context_length=cfg.n_ctx,
                                    size_rank=cfg.size_rank, connect_timeout_s=cfg.connect_timeout_s,
                                    ttft_timeout_s=cfg.ttft_timeout_s,
                                    read_timeout_s=cfg.read_timeout_s)
                for url in cfg.replica_urls()]
    return replicas[0] if len(replicas) == 1 else PoolBackend(cfg.name, replicas)
