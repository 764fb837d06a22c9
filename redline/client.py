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


def stream_chat(client: OpenAI, *, max_resumes: int = 5, backoff_s: float = 0.05,
                **params: Any) -> Iterator[ChatCompletionChunk]:
    """`client.chat.completions.create(stream=True, **params)` that resumes by itself
    (at most `max_resumes` times, waiting `backoff_s`, doubled each time, after the
    second try in a row without progress)."""
    body, options = _request(params)
    position = _Position()
    stream = client.post("/chat/completions", body=body, options=options,  # type: ignore[call-overload]
                         cast_to=ChatCompletionChunk, stream=True, stream_cls=_TrackedStream)
    resumes = 0
    while True:
        stream.position = position
        position.stream_id = position.stream_id or _header_id(stream)
        seq_before = position.seq
        try:
            yield from stream
        except _BROKEN:
            if position.stream_id is None:
                raise
        finally:
            stream.close()
        if position.done:
            return
        if position.stream_id is None or resumes >= max_resumes:
            raise openai.APIConnectionError(message="the stream broke and could not be resumed",
                                            request=stream.response.request)
        resumes += 1
        if position.seq == seq_before and resumes > 1:
            time.sleep(backoff_s * 2 ** (resumes - 2))
        stream = client.get(f"/streams/{position.stream_id}",  # type: ignore[call-overload]
                            options=_resume_options(options, position),
                            cast_to=ChatCompletionChunk, stream=True, stream_cls=_TrackedStream)


async def astream_chat(client: AsyncOpenAI, *, max_resumes: int = 5, backoff_s: float = 0.05,
                       **params: Any) -> AsyncIterator[ChatCompletionChunk]:
    """`stream_chat` for `AsyncOpenAI`."""
    body, options = _request(params)
    position = _Position()
    stream = await client.post("/chat/completions", body=body,  # type: ignore[call-overload]
                               options=options, cast_to=ChatCompletionChunk, stream=True,
                               stream_cls=_AsyncTrackedStream)
    resumes = 0
    while True:
        stream.position = position
        position.stream_id = position.stream_id or _header_id(stream)
        seq_before = position.seq
        try:
            async for chunk in stream:
                yield chunk
        except _BROKEN:
            if position.stream_id is None:
                raise
        finally:
            await stream.close()
        if position.done:
            return
        if position.stream_id is None or resumes >= max_resumes:
            raise openai.APIConnectionError(message="the stream broke and could not be resumed",
                                            request=stream.response.request)
        resumes += 1
        if position.seq == seq_before and resumes > 1:
            await asyncio.sleep(backoff_s * 2 ** (resumes - 2))
        stream = await client.get(f"/streams/{position.stream_id}",  # type: ignore[call-overload]
                                  options=_resume_options(options, position),
                                  cast_to=ChatCompletionChunk, stream=True,
                                  stream_cls=_AsyncTrackedStream)
