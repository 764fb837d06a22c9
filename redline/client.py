"""Streams that survive a dropped connection, for the official `openai` client.

    from openai import OpenAI
    from redline.client import stream_chat

    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="-")
    for chunk in stream_chat(client, model="auto", messages=[{"role": "user", "content": "Hi"}]):
        print(chunk.choices[0].delta.content or "", end="")

It yields the same `ChatCompletionChunk`s as `client.chat.completions.create(
stream=True)`. When the connection breaks mid-stream it asks redline for the rest
(`GET /v1/streams/{id}` with `Last-Event-ID: <id>:<seq>`) and goes on: the chunks
you get are exactly those of an unbroken stream, none missing, none twice.
`astream_chat` is the same for `AsyncOpenAI`. A stream that can no longer be
resumed (expired, or abandoned past the server's grace period) raises the
`openai.NotFoundError` of the resume request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx
import openai
from openai import AsyncOpenAI, AsyncStream, OpenAI, Stream
from openai.types.chat import ChatCompletionChunk

STREAM_ID_HEADER = "x-redline-stream-id"
# what a broken connection looks like (openai wraps transport errors; a body cut
# short between two events may also end the iteration early, without [DONE])
_BROKEN = (openai.APIConnectionError,)


class _Position:
    """Where the client is in the stream: the last event id seen, and [DONE]."""

    def __init__(self) -> None:
        self.stream_id: str | None = None
        self.seq = 0
        self.done = False

    def see(self, event_id: str | None, data: str) -> None:
        if event_id:
            sid, _, seq = event_id.rpartition(":")
            if sid and seq.isdigit():
                self.stream_id, self.seq = sid, int(seq)
        if data.startswith("[DONE]"):
            self.done = True

    def last_event_id(self) -> str:
        return f"{self.stream_id}:{self.seq}"


class _TrackedStream(Stream[ChatCompletionChunk]):
    position: _Position

    def _iter_events(self) -> Iterator[Any]:
        for sse in super()._iter_events():
            self.position.see(sse.id, sse.data)
            yield sse


class _AsyncTrackedStream(AsyncStream[ChatCompletionChunk]):
    position: _Position

    async def _iter_events(self) -> AsyncIterator[Any]:
        async for sse in super()._iter_events():
            self.position.see(sse.id, sse.data)
            yield sse


def _request(params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """create()-style keyword arguments → (JSON body, request options)."""
    body = {k: v for k, v in params.items()
            if k not in ("extra_headers", "extra_body", "extra_query", "timeout")}
    body.update(params.get("extra_body") or {})
    body["stream"] = True
    options: dict[str, Any] = {"headers": dict(params.get("extra_headers") or {})}
    if params.get("extra_query"):
        options["params"] = dict(params["extra_query"])
    if params.get("timeout") is not None:
        options["timeout"] = params["timeout"]
    return body, options


def _resume_options(options: dict[str, Any], position: _Position) -> dict[str, Any]:
    return {**options, "headers": {**options["headers"], "Last-Event-ID": position.last_event_id()}}


def _header_id(stream: Stream[Any] | AsyncStream[Any]) -> str | None:
    return stream.response.headers.get(STREAM_ID_HEADER)


class _Retries:
    """How many resumes are left, and how long to wait before the next one: at once
    after a break that made progress, with doubling waits while none does."""

    def __init__(self, max_resumes: int, backoff_s: float) -> None:
        self.left, self.backoff_s = max_resumes, backoff_s
        self.idle = 0  # resumes in a row without a new event
        self.seq = -1

    def next_wait(self, position: _Position, error: BaseException | None) -> float:
        if position.stream_id is None or self.left <= 0:
            if error is not None:
                raise error
            # openai types `request` as the httpx it bundles (httpx2 in openai 3.x); it only
            # keeps it for the caller to read, and any httpx's Request reads the same
            request: Any = httpx.Request("GET", "/v1/streams")
            raise openai.APIConnectionError(
                message="the stream broke and could not be resumed", request=request)
        self.left -= 1
        self.idle = self.idle + 1 if position.seq == self.seq else 0
        self.seq = position.seq
        return 0.0 if self.idle == 0 else self.backoff_s * 2 ** (self.idle - 1)


def stream_chat(client: OpenAI, *, max_resumes: int = 5, backoff_s: float = 0.05,
                **params: Any) -> Iterator[ChatCompletionChunk]:
    """`client.chat.completions.create(stream=True, **params)` that resumes by itself,
    at most `max_resumes` times (the resume request failing counts as one)."""
    body, options = _request(params)
    position = _Position()
    retries = _Retries(max_resumes, backoff_s)
    stream: _TrackedStream | None = client.post(  # type: ignore[call-overload]  # openai's own stream_cls hook
        "/chat/completions", body=body, options=options, cast_to=ChatCompletionChunk,
        stream=True, stream_cls=_TrackedStream)
    while True:
        error: BaseException | None = None
        if stream is not None:
            stream.position = position
            position.stream_id = position.stream_id or _header_id(stream)
            try:
                yield from stream
            except _BROKEN as exc:
                error = exc
            finally:
                stream.close()
            if position.done:
                return
        time.sleep(retries.next_wait(position, error))
        try:
            stream = client.get(f"/streams/{position.stream_id}",  # type: ignore[call-overload]  # openai's own stream_cls hook
                                options=_resume_options(options, position),
                                cast_to=ChatCompletionChunk, stream=True, stream_cls=_TrackedStream)
        except _BROKEN:
            stream = None


async def astream_chat(client: AsyncOpenAI, *, max_resumes: int = 5, backoff_s: float = 0.05,
                       **params: Any) -> AsyncIterator[ChatCompletionChunk]:
    """`stream_chat` for `AsyncOpenAI`."""
    body, options = _request(params)
    position = _Position()
    retries = _Retries(max_resumes, backoff_s)
    stream: _AsyncTrackedStream | None = await client.post(  # type: ignore[call-overload]  # openai's own stream_cls hook
        "/chat/completions", body=body, options=options, cast_to=ChatCompletionChunk,
        stream=True, stream_cls=_AsyncTrackedStream)
    while True:
        error: BaseException | None = None
        if stream is not None:
            stream.position = position
            position.stream_id = position.stream_id or _header_id(stream)
            try:
                async for chunk in stream:
                    yield chunk
            except _BROKEN as exc:
                error = exc
            finally:
                await stream.close()
            if position.done:
                return
        await asyncio.sleep(retries.next_wait(position, error))
        try:
            stream = await client.get(  # type: ignore[call-overload]  # openai's own stream_cls hook
                f"/streams/{position.stream_id}", options=_resume_options(options, position),
                cast_to=ChatCompletionChunk, stream=True, stream_cls=_AsyncTrackedStream)
        except _BROKEN:
            stream = None
