"""Runs one request the way a live request runs: `Pipeline.complete`, then the chunks
to the end (cache, routing and engine all apply)."""

from __future__ import annotations

from typing import Any

from redline.errors import BackendError
from redline.jobs.shapes import response_body
from redline.jobs.spec import JobSpec
from redline.pipeline import Pipeline


async def run_request(pipeline: Pipeline, spec: JobSpec) -> dict[str, Any]:
    """The OpenAI response body for `spec`; raises RedlineError when it fails."""
    request = spec.request()
    completion = await pipeline.complete(request)
    text: list[str] = []
    error: str | None = None
    async for chunk in completion.chunks:
        if chunk.finish_reason == "error":
            error = chunk.error or "generation failed"
            break
        text.append(chunk.text)
    if error is not None:
        raise BackendError(error)
    return response_body(spec.endpoint, request.id, completion.model, "".join(text),
                         completion.finish_reason, completion.usage)
