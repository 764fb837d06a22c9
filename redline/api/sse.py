"""Server-sent events: `id: <stream_id>:<seq>` on every event, seq from 1."""

from __future__ import annotations

import json
from typing import Any

DONE = "[DONE]"


def event(stream_id: str, seq: int, data: dict[str, Any] | str) -> bytes:
    body = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"id: {stream_id}:{seq}\ndata: {body}\n\n".encode()


def parse_event_id(value: str) -> tuple[str, int]:
    """`strm-…:12` → ("strm-…", 12). Raises ValueError on anything else."""
    stream_id, _, seq = value.rpartition(":")
    if not stream_id or not seq.isdigit():
        raise ValueError(f"not an event id: {value!r}")
    return stream_id, int(seq)
