"""A stream's continuation on another replica of its model, when the replica serving it
dies mid-answer (routing/migrate.py moves it): the same request again, with the text
generated so far as the start of the answer, asking only for the tokens still to come.

How an engine is asked to continue a partial answer (`PlacementConfig.migrate`):

- text completions: the prompt with the text so far appended. Every completions
  endpoint does this by construction (and the embedded engine too).
- chat, `continue_final_message`: the messages and a final assistant message holding the
  text so far, with `continue_final_message: true` and `add_generation_prompt: false`:
  vLLM's fields (SGLang's chat API takes the same ones); the engine renders the chat
  template open-ended after that message and its prefix cache holds most of it.
- chat, `prefill`: the same final assistant message without the fields: llama.cpp's
  server continues a final assistant message by default (`--no-prefill-assistant` turns
  it off), as Anthropic's API does.
- `text_only`: chat streams do not move (for an engine that renders a new assistant turn
  after a final assistant message); `off`: nothing moves. The embedded engine takes
  `continue_final_message` as vLLM does (engine/llama.py `render_chat`).

The text is resent, not token ids: OpenAI-compatible streams do not carry ids, so the
engine re-tokenises it; at a token boundary that can split differently from the dead
replica's tokens, which changes nothing the client has and only the odds of what comes.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from redline.types import GUIDED, GenerationRequest, Message, new_id

Mode = Literal["continue_final_message", "prefill", "text_only", "off"]
_CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}


def why_not(request: GenerationRequest, mode: Mode) -> str | None:
    """Why a stream of `request` cannot continue on another replica (None: it can)."""
    if mode == "off":
        return "migration is off for this model"
    if request.is_chat and mode == "text_only":
        return "its engine cannot continue a partial assistant message"
    if request.choices != 1:
        return "it has several choices"
    if request.prompt_ids:
        return "its prompt is token ids, and the text so far is not"
    fmt = request.response_format
    if fmt is not None and fmt.type != "text":  # a grammar would restart from the prefix
        return "its response_format constrains the answer from its start"
    guided = next((k for k in GUIDED if request.extra.get(k) is not None), None)
    if guided is not None:  # vLLM's structured outputs: the same
        return f"its {guided} constrains the answer from its start"
    return None


def continuation(request: GenerationRequest, text: str, tokens: int,
                 mode: Mode) -> GenerationRequest:
    """`request` continued after `text` (`tokens` output tokens): what a replica is asked
    to produce the rest of the same answer. `why_not(request, mode)` must be None."""
    sampling = dataclasses.replace(request.sampling,
                                   max_tokens=max(1, request.sampling.max_tokens - tokens))
    rid = new_id("req")  # a new engine sequence; the pool's block memo is keyed by it
    if request.messages is None:
        return dataclasses.replace(request, id=rid, sampling=sampling,
                                   prompt=(request.prompt or "") + text)
    messages = request.messages
    extra = dict(request.extra)
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant" and (
            extra.get("continue_final_message") or mode == "prefill"):
        # the client prefilled the answer itself: the text so far extends its message
        messages = (*messages[:-1], dataclasses.replace(last, content=last.content + text,
                                                        parts=None))
    else:
        messages = (*messages, Message("assistant", text))
    if mode == "continue_final_message":
        extra.update(_CONTINUE)
    return dataclasses.replace(request, id=rid, sampling=sampling, messages=messages,
                               extra=extra)
