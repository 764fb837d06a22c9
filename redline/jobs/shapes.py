"""OpenAI response bodies for answers produced off-line (jobs and batch lines): the
same objects /v1/chat/completions and /v1/completions return."""

from __future__ import annotations

import time
from typing import Any

from redline.jobs.spec import Endpoint
from redline.types import Usage


def response_body(endpoint: Endpoint, request_id: str, model: str, text: str,
                  finish_reason: str | None, usage: Usage | None) -> dict[str, Any]:
    suffix = request_id.split("-", 1)[-1]
    u = usage or Usage(0, 0)
    usage_d = {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
               "total_tokens": u.total_tokens}
    finish = finish_reason or "stop"
    if endpoint == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": finish}
        return {"id": f"chatcmpl-{suffix}", "object": "chat.completion",
                "created": int(time.time()), "model": model, "choices": [choice],
                "usage": usage_d}
    return {"id": f"cmpl-{suffix}", "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "text": text, "logprobs": None,
                                         "finish_reason": finish}], "usage": usage_d}
