"""Text that cannot be UTF-8: JSON may escape a lone UTF-16 surrogate (`"\\ud800"`),
which parses into a Python str that no encoder takes. Left in a request it fails much
later, as a 500 (the tokenizer, a remote engine's JSON body, a Redis key); found at the
edge it is the client's mistake, a 400 that names the field."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from redline.errors import InvalidRequest

_MAX_DEPTH = 64  # the parsers refuse deeper bodies first; a bound, not a limit of its own


def unencodable(value: Any, path: str = "", depth: int = 0) -> str | None:
    """The path of the first string in `value` (a parsed body, or a pydantic model) that
    holds a lone surrogate; None when every string encodes."""
    if isinstance(value, str):
        if value.isascii():  # the common case: nothing to encode
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    if depth > _MAX_DEPTH:
        return None
    if isinstance(value, BaseModel):
        items: Any = [*value.__dict__.items(), *(value.model_extra or {}).items()]
    elif isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = ((f"[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for key, item in items:
        if isinstance(key, str) and not key.isascii():
            try:
                key.encode("utf-8")
            except UnicodeEncodeError:
                return path or "body"
        sub = f"{path}{key}" if isinstance(key, str) and key.startswith("[") else \
            (f"{path}.{key}" if path else str(key))
        found = unencodable(item, sub, depth + 1)
        if found is not None:
            return found
    return None


def check_text(body: Any) -> None:
    """400 (param: the field) for a body with a lone surrogate anywhere in it."""
    where = unencodable(body)
    if where is not None:
        raise InvalidRequest(f"Invalid Unicode in '{where}': a lone surrogate (such as "
                             "\\ud800) is not text; send UTF-8.", param=where,
                             code="invalid_unicode")


__all__ = ["check_text", "unencodable"]
