"""Every error leaves as OpenAI-shaped JSON with the status OpenAI would use.
Validation errors are 400, never 422; unexpected faults are 500 with a safe message."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from redline.errors import InvalidRequest, NotFound, RedlineError, RequestTimeout

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


def error_response(exc: RedlineError) -> JSONResponse:
    headers = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return JSONResponse(exc.to_dict(), status_code=exc.status, headers=headers)


def answer(exc: RedlineError) -> JSONResponse:
    """The response to a RedlineError, from a route of FastAPI's or a hot route's
    (api/hot.py): the one place an error becomes a response."""
    if exc.status >= 500:
        log.warning("%s: %s", type(exc).__name__, exc.message)
    return error_response(exc)


def invalid_body(exc: ValidationError) -> InvalidRequest:
    """A body that did not validate against its model, as FastAPI's body reader would
    have reported it (its locations start at "body")."""
    errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
    return validation_error(RequestValidationError(errors))


def validated(schema: type[M], data: Any) -> M:
    """`data` (a decoded body, a batch line's body) as `schema`, or the 400 the body
    reader gives a body that does not validate."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise invalid_body(exc) from exc


def _param(loc: Sequence[Any]) -> str | None:
    parts = [p for p in loc if p != "body"]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p in ("str", "list[ContentPart]", "function-after[_stops(), union[str,list[str]]]"):
            continue  # union branch names, not fields
        else:
            out += ("." if out else "") + str(p)
    return out or None


def validation_error(exc: RequestValidationError) -> InvalidRequest:
    errors = exc.errors()
    first = errors[0] if errors else {}
    kind = first.get("type", "")
    if kind == "json_invalid":
        return InvalidRequest("We could not parse the JSON body of your request. (HINT: This likely "
                              "means you aren't using your HTTP library correctly.)")
    param = _param(first.get("loc", ()))
    if kind in ("model_attributes_type", "dict_type", "model_type") and param is None:
        return InvalidRequest("The request body must be a JSON object.")
    if kind == "missing":
        return InvalidRequest(f"Missing required parameter: '{param}'.", param=param,
                              code="missing_required_parameter")
    msg = first.get("msg", "invalid value")
    return InvalidRequest(f"Invalid value for '{param}': {msg}.", param=param,
                          code="invalid_value")


def install(app: FastAPI) -> None:
    @app.exception_handler(RedlineError)
    async def _redline(_: Request, exc: RedlineError) -> JSONResponse:
        return answer(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            err: RedlineError = NotFound("Not found: no such route or object.")
        elif exc.status_code == 408:  # middleware.BodyTimeout
            err = RequestTimeout(str(exc.detail))
        else:
            err = RedlineError(str(exc.detail))
            err.status = exc.status_code
            err.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return error_response(err)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return error_response(RedlineError("The server had an error while processing your request."))
