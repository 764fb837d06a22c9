"""A request body as a job: what a batch line or a queued request runs. The jobs
service (jobs/service.py) is handed `decode_body` by the factory (api/services.py),
so it checks a body exactly as the live endpoint does without importing the api."""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from redline.api.errors import validation_error
from redline.api.schemas import ChatCompletionRequest, CompletionRequest
from redline.api.unicode import check_text
from redline.errors import InvalidRequest
from redline.jobs.spec import ENDPOINTS, JobSpec


def decode_body(url: str, body: dict[str, Any]) -> JobSpec:
    """A request body of `url` (a batch line, a scheduled job) as a job spec; bad bodies
    raise InvalidRequest just as the live endpoint would answer them."""
    endpoint = ENDPOINTS.get(url)
    if endpoint is None:
        raise InvalidRequest(f"Unsupported url {url!r}; use one of {sorted(ENDPOINTS)}.",
                             param="url")
    schema = ChatCompletionRequest if endpoint == "chat" else CompletionRequest
    check_text(body)
    try:
        parsed = schema.model_validate(body)
    except ValidationError as exc:
        raise validation_error(RequestValidationError(exc.errors())) from exc
    return JobSpec.of(endpoint, parsed.to_generation(parsed.tier, "anonymous"))


__all__ = ["decode_body"]
