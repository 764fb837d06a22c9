"""Function tools on the embedded engine: the prompt, the grammar, the parse.

llama.cpp's tool-call templating lives in its `common` library, which the wheel does not
export, and `llama_chat_apply_template` renders role and text only. So the tools are
rendered here, in one documented format: Qwen2.5's (Hermes-style) tool prompt. Qwen2.5
instruct models were trained on it; other models get the same text (with `tool_choice`
`required` or a named function the grammar makes any model's answer a valid call).

    system: <the client's system text>

            # Tools
            ...
            <tools>
            {"type": "function", "function": {...}}     one line per tool
            </tools>
            ... <tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>
    assistant turn with tool calls: its text, then one <tool_call> block per call
    tool result: a user turn of <tool_response>\\n...\\n</tool_response> (as Qwen2.5's template)

The answer is parsed back: text outside <tool_call> blocks is content; a block whose JSON
names a listed function with object arguments is a tool call; anything else stays text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from redline.engine.grammar import converter, text, visit
from redline.errors import InvalidRequest
from redline.types import FunctionTool, Message, ToolCallDelta, ToolChoice, new_id

OPEN, CLOSE = "<tool_call>", "</tool_call>"

_INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


def _spec(tool: FunctionTool) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        fn["description"] = tool.description
    fn["parameters"] = dict(tool.parameters) if tool.parameters is not None else {
        "type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def offered(tools: tuple[FunctionTool, ...], choice: ToolChoice | None) -> tuple[FunctionTool, ...]:
    """The tools the model may call under `choice`."""
    if choice is None or choice.mode in ("auto", "required"):
        return tools
    if choice.mode == "function":
        return tuple(t for t in tools if t.name == choice.name)
    return ()


def render(messages: tuple[Message, ...], tools: tuple[FunctionTool, ...],
           choice: ToolChoice | None) -> tuple[Message, ...]:
    """The conversation as text turns in the tool format (see the module's docstring)."""
    out: list[Message] = []
    listed = offered(tools, choice)
    if listed:
        block = _INSTRUCTIONS.format(tools="\n".join(json.dumps(_spec(t)) for t in listed))
        if messages and messages[0].role == "system":
            out.append(Message("system", f"{messages[0].content}\n\n{block}"))
            messages = messages[1:]
        else:
            out.append(Message("system", block))
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            calls = [f'{OPEN}\n{{"name": {json.dumps(c.name)}, "arguments": '
                     f"{c.arguments or '{}'}}}\n{CLOSE}" for c in m.tool_calls]
            out.append(Message("assistant", "\n".join(([m.content] if m.content else []) + calls)))
        elif m.role == "tool":
            out.append(Message("user", f"<tool_response>\n{m.content}\n</tool_response>"))
        else:
            out.append(Message(m.role, m.content))
    return tuple(out)


def grammar(tools: tuple[FunctionTool, ...], choice: ToolChoice | None,
            parallel: bool | None = None) -> str | None:
    """GBNF forcing a call of an offered tool (`required` or a named function), or None:
    one or more with `parallel` true (`parallel_tool_calls: true`), one block a line, as
    Qwen2.5 writes several; else exactly one. Unset is one, not OpenAI's "several
    allowed": a small model forced to call keeps adding calls until max_tokens cuts it."""
    if choice is None or choice.mode not in ("required", "function"):
        return None
    listed = offered(tools, choice)
    if not listed:
        raise InvalidRequest(f"tool_choice names `{choice.name}`, which is not in `tools`.",
                             param="tool_choice")
    conv: Any = converter()
    alts = []
    for i, tool in enumerate(listed):
        params = dict(tool.parameters) if tool.parameters is not None else {"type": "object"}
        args = visit(conv, params, f"tool{i}-args", "tools")
        name = json.dumps(json.dumps(tool.name))  # a GBNF literal of the JSON string
        alts.append(f'"{OPEN}\\n{{\\"name\\": " {name} ", \\"arguments\\": " {args} '
                    f'"}}\\n{CLOSE}"')
    # the converter's own rule table (it renames a rule whose name is taken)
    call = conv._add_rule("call", " | ".join(alts))  # noqa: SLF001
    conv._add_rule("root", f'{call} ( "\\n" {call} )*' if parallel else call)  # noqa: SLF001
    return text(conv)


@dataclass
class ToolCallParser:
    """Splits an answer streamed as text into content and tool-call deltas."""

    tools: tuple[FunctionTool, ...]
    held: str = ""  # text not yet emitted: a possible start of OPEN, or an open block
    inside: bool = False
    calls: int = 0
    _names: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        self._names = frozenset(t.name for t in self.tools)

    def feed(self, text: str) -> tuple[str, tuple[ToolCallDelta, ...]]:
        """Content to emit now and the tool-call deltas completed by `text`."""
        self.held += text
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        while True:
            if not self.inside:
                at = self.held.find(OPEN)
                if at < 0:
                    keep = _partial(self.held, OPEN)
                    content.append(self.held[: len(self.held) - keep])
                    self.held = self.held[len(self.held) - keep:]
                    break
                content.append(self.held[:at])
                self.held = self.held[at:]
                self.inside = True
            end = self.held.find(CLOSE)
            if end < 0:
                break
            block, self.held = self.held[: end + len(CLOSE)], self.held[end + len(CLOSE):]
            self.inside = False
            call = self._call(block[len(OPEN): -len(CLOSE)])
            if call is None:
                content.append(block)
            else:
                deltas.extend(call)
        return "".join(content), tuple(deltas)

    def flush(self) -> str:
        """At the end: what is held (an unfinished block) is text."""
        text, self.held, self.inside = self.held, "", False
        return text

    def _call(self, body: str) -> tuple[ToolCallDelta, ...] | None:
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        if not (isinstance(obj, dict) and obj.get("name") in self._names):
            return None
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        index, self.calls = self.calls, self.calls + 1
        # as OpenAI streams a call: id, type and name first, then the arguments
        return (ToolCallDelta(index, new_id("call"), "function", obj["name"], ""),
                ToolCallDelta(index, arguments=json.dumps(args, ensure_ascii=False)))


def _partial(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that starts `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
