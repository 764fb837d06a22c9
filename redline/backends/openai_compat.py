"""Any OpenAI-compatible engine (vLLM, SGLang, TGI, Ollama, llama.cpp's server, OpenAI)
as a backend, streamed over httpx.

Closing the stream closes the upstream response, so the engine sees its client go and
stops generating: a client that leaves, or a hedge that loses, costs the upstream nothing
more. Errors before the first token are raised as redline errors (BackendError is
retryable, InvalidRequest is the user's); after it, the stream ends with an error chunk.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from redline.backends.base import Backend, BackendInfo
from redline.backends.pool import PoolBackend
from redline.config import ModelConfig
from redline.errors import BackendError, ContextLengthExceeded, InvalidRequest
from redline.types import Chunk, FinishReason, GenerationRequest, StageTimings, Usage

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "eos": "stop",
                                    "abort": "cancelled", "error": "error"}


class OpenAICompatBackend:
    def __init__(self, name: str, url: str, *, upstream_model: str | None = None,
                 api_key: str | None = None, context_length: int = 4096, size_rank: int = 1,
                 connect_timeout_s: float = 2.0, ttft_timeout_s: float = 30.0,
                 read_timeout_s: float = 60.0, client: httpx.AsyncClient | None = None) -> None:
        self.info = BackendInfo(name, "openai", context_length, size_rank)
        self.base = url.rstrip("/")
        if not self.base.endswith("/v1"):
            self.base += "/v1"
        self.upstream_model = upstream_model or name
        # parsed once: httpx parses a URL string on every request otherwise
        self._urls = {"chat": httpx.URL(f"{self.base}/chat/completions"),
                      "text": httpx.URL(f"{self.base}/completions")}
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # httpx has one read timeout; the first token may take longer than later ones
        timeout = httpx.Timeout(connect=connect_timeout_s, read=max(ttft_timeout_s, read_timeout_s),
                                write=connect_timeout_s, pool=connect_timeout_s)
        self._new_client = lambda: httpx.AsyncClient(headers=headers, timeout=timeout,
                                                     limits=_SHARD_LIMITS)
        self._shards = _Shards([client] if client else [], self._new_client)
        self.inflight = 0

    async def start(self) -> None:
        return None  # a remote engine is up or not; the breaker learns which

    async def close(self) -> None:
        await self._shards.close()

    def load(self) -> int:
        return self.inflight

    def _payload(self, request: GenerationRequest) -> tuple[httpx.URL, dict[str, Any]]:
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
        url, body = self._payload(request)
        t0 = time.perf_counter()
        self.inflight += 1
        shard = self._shards.pick()
        shard.inflight += 1
        response: httpx.Response | None = None
        try:
            try:
                response = await shard.client.send(
                    shard.client.build_request("POST", url, json=body), stream=True)
            except httpx.HTTPError as exc:
                raise BackendError(f"{self.info.name}: upstream unreachable "
                                   f"({type(exc).__name__})") from exc
            if response.status_code >= 400:
                await response.aread()
                raise _upstream_error(self.info.name, response)
            async for chunk in self._chunks(response, request, t0):
                yield chunk
        finally:
            self.inflight -= 1
            shard.inflight -= 1
            if response is not None:
                await response.aclose()  # upstream sees the disconnect and stops

    async def _chunks(self, response: httpx.Response, request: GenerationRequest,
                      t0: float) -> AsyncIterator[Chunk]:
        ttft: float | None = None
        tokens = 0
        finish: FinishReason | None = None
        tail = ""  # text that came with the finish reason; sent with the last chunk
        usage: Usage | None = None
        done = False
        try:
            async for line in response.aiter_lines():
                # after [DONE], read on to the end of the body (there is nothing more but
                # its terminator) so that the connection goes back to the pool instead of
                # being closed: a new TCP connection per request costs more than the rest
                if done or not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    continue
                event = json.loads(data)
                if "error" in event and not event.get("choices"):
                    raise BackendError(f"{self.info.name}: {_message(event)}")
                if event.get("usage"):
                    u = event["usage"]
                    usage = Usage(int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0))
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
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            if tokens == 0:
                raise BackendError(f"{self.info.name}: upstream stream broke "
                                   f"({type(exc).__name__})") from exc
            yield Chunk(finish_reason="error", error=f"upstream stream broke ({type(exc).__name__})")
            return
        end = time.perf_counter() - t0
        first = ttft if ttft is not None else end
        timings = StageTimings({"prefill": first, "decode": end - first})
        if usage is None:
            usage = Usage(0, tokens)
        yield Chunk(text=tail, tokens=1 if tail else 0, finish_reason=finish or "stop",
                    usage=usage, timings=timings)


# httpcore's pool looks at every pooled connection on each request and each release
# (is it expired? is the socket readable? a getpeername() each): at 64 streams that
# was half the gateway's CPU. Several small pools keep each scan short.
_SHARD_LIMITS = httpx.Limits(max_connections=256, max_keepalive_connections=16)
_PER_SHARD = 4  # requests in flight on a shard before another pool is opened
_MAX_SHARDS = 64


class _Shard:
    __slots__ = ("client", "inflight")

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.inflight = 0


class _Shards:
    """Connection pools to one upstream; a request takes the least busy one."""

    def __init__(self, clients: list[httpx.AsyncClient], new: Any) -> None:
        self.shards = [_Shard(c) for c in clients]
        self.fixed = bool(clients)  # a client given from outside: use it alone
        self.new = new

    def pick(self) -> _Shard:
        best = min(self.shards, key=lambda s: s.inflight) if self.shards else None
        if best is None or (not self.fixed and best.inflight >= _PER_SHARD
                            and len(self.shards) < _MAX_SHARDS):
            best = _Shard(self.new())
            self.shards.append(best)
        return best

    async def close(self) -> None:
        for shard in self.shards:
            await shard.client.aclose()


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


def _upstream_error(name: str, response: httpx.Response) -> Exception:
    try:
        payload: Any = response.json()
    except ValueError:
        payload = response.text[:200]
    msg = _message(payload)
    status = response.status_code
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
