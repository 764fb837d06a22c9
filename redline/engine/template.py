"""A model's own chat template: the Jinja source its GGUF carries (`tokenizer.chat_template`),
rendered as transformers renders it, which is what vLLM, SGLang and llama.cpp's server
(`--jinja`, its default) send the model.

llama.cpp's C API renders role and text only, through templates it recognises by their
text (`llama_chat_apply_template`). That drops what a template adds by itself: SmolLM2's
and Qwen2.5's default system turn ("You are a helpful AI assistant named SmolLM, ..."),
a model's native tool prompt, and the keyword arguments a template reads
(`chat_template_kwargs`, such as Qwen3's `enable_thinking`).

The environment is transformers' (`apply_chat_template`): sandboxed and immutable, blocks
trimmed, `loopcontrols`, `tojson` that keeps non-ASCII text, `raise_exception` and
`strftime_now`. A template's own error (roles that do not alternate, say) is a 400 with
its message, as vLLM answers it.

    t = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    t.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.sandbox

from redline.errors import InvalidRequest

# what the render itself passes: a request's chat_template_kwargs cannot replace them
RESERVED = frozenset(("messages", "tools", "add_generation_prompt", "bos_token", "eos_token"))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _environment() -> jinja2.Environment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """One compiled Jinja chat template. `TemplateSyntaxError` from the constructor: the
    source does not compile (the caller falls back to llama.cpp's built-in rendering)."""

    def __init__(self, source: str, bos_token: str, eos_token: str) -> None:
        env = _environment()
        self.source = source
        self._template = env.from_string(source)
        self._tokens = {"bos_token": bos_token, "eos_token": eos_token}
        names = jinja2.meta.find_undeclared_variables(env.parse(source))
        # a template that lists tools itself and writes an assistant turn's calls: the
        # model's own tool prompt (Qwen2.5's); else engine/tools.py renders them as text
        self.renders_tools = "tools" in names and "tool_calls" in source

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None,
               kwargs: dict[str, Any] | None = None) -> str:
        extra = dict(kwargs or {})
        taken = sorted(RESERVED & extra.keys())
        if taken:
            raise InvalidRequest(f"chat_template_kwargs.{taken[0]}: the request's own fields "
                                 "set it.", param=f"chat_template_kwargs.{taken[0]}")
        try:
            return self._template.render(messages=messages, tools=tools or None,
                                         add_generation_prompt=add_generation_prompt,
                                         **self._tokens, **extra)
        except jinja2.TemplateError as exc:
            raise InvalidRequest(f"The model's chat template refused the messages: {exc}",
                                 param="messages") from exc
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            raise InvalidRequest(f"The model's chat template could not render the messages "
                                 f"({type(exc).__name__}: {exc}).", param="messages") from exc
