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

The answer is parsed back: a <tool_call> block, or a bare `{"name": ..., "arguments": ...}`
object (fenced or not), whose JSON names a listed function with object arguments is a tool
call; everything else is content.

The grammar: `tool_choice` `required` or a named function forces a call from the answer's
start (`grammar`); `auto` holds a call once the model has begun one (`lazy_grammar`, whose
trigger the sampler watches for). A call the grammar holds is sure to be valid, so the
parser streams it as it is written (id and name once the name is written, then the
arguments piece by piece); a call
parsed from free text is given whole, once it is sure to be one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

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


def specs(tools: tuple[FunctionTool, ...], choice: ToolChoice | None) -> list[dict[str, Any]]:
    """The offered tools as OpenAI's function specs: what a template that renders tools
    itself (Qwen2.5's) is given, as vLLM and llama.cpp's server give it."""
    return [_spec(t) for t in offered(tools, choice)]


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
    return _calls(listed, parallel)


def lazy_grammar(tools: tuple[FunctionTool, ...], choice: ToolChoice | None,
                 parallel: bool | None = None) -> tuple[str, str] | None:
    """`tool_choice: auto`: a grammar for a call the model starts, and its trigger (a regular
    expression: the grammar applies from its group on; sampling.py). The model answers in
    text or calls as it likes; once it has written `<tool_call>`, or a bare object's
    `{"name": "<a listed tool>"`, the rest is a valid call of a listed tool, its arguments
    valid for the tool's schema (as many calls as `grammar` allows, in the form begun;
    then the answer ends). So text that only looks like a call is never constrained. None
    when there is nothing to call, or when a tool's schema is one the grammar cannot
    enforce (its calls are then parsed, unchecked, as before)."""
    if choice is not None and choice.mode != "auto":
        return None
    listed = offered(tools, choice)
    if not listed:
        return None
    try:
        gbnf = _calls(listed, parallel, lazy=True)
    except InvalidRequest:
        return None
    return gbnf, f'({re.escape(OPEN)}|\\{{\\s*"name"\\s*:\\s*(?:{_names(listed)}))'


def _names(tools: tuple[FunctionTool, ...]) -> str:
    """A regular expression for any of the tools' names as a JSON string."""
    return "|".join(re.escape(json.dumps(t.name)) for t in tools)


def _calls(listed: tuple[FunctionTool, ...], parallel: bool | None, lazy: bool = False) -> str:
    """Calls of `listed`: forced, each `<tool_call>` block exactly as the tool prompt asks;
    lazy, the block or a bare object (closing a ```json fence or not), with some room for
    whitespace, since the model chose how to begin."""
    conv: Any = converter()
    alts = []
    for i, tool in enumerate(listed):
        params = dict(tool.parameters) if tool.parameters is not None else {"type": "object"}
        args = visit(conv, params, f"tool{i}-args", "tools")
        name = json.dumps(json.dumps(tool.name))  # a GBNF literal of the JSON string
        if lazy:
            alts.append(f'{name} tws "," tws "\\"arguments\\"" tws ":" tws {args}')
        else:
            alts.append(f'"{OPEN}\\n{{\\"name\\": " {name} ", \\"arguments\\": " {args} '
                        f'"}}\\n{CLOSE}"')
    # the converter's own rule table (it renames a rule whose name is taken)
    add = conv._add_rule  # noqa: SLF001
    if not lazy:
        call = add("call", " | ".join(alts))
        add("root", f'{call} ( "\\n" {call} )*' if parallel else call)
        return text(conv)
    add("tws", "[ \\t\\n]{0,16}")  # room for a pretty-printed object's indentation
    obj = add("call-object", '"{" tws "\\"name\\"" tws ":" tws ( ' + " | ".join(alts)
              + ' ) tws "}"')
    block = add("call-block", f'"{OPEN}" tws {obj} tws "{CLOSE}"')
    blocks, objects = (f"{block} ( tws {block} )*", f"{obj} ( tws {obj} )*") if parallel \
        else (block, obj)
    add("root", f'{blocks} | {objects} ( tws "```" )?')
    return text(conv)


@dataclass
class ToolCallParser:
    """Splits an answer streamed as text into content and tool-call deltas.

    A call is a <tool_call> block, or a bare JSON object `{"name": ..., "arguments": ...}`
    (in a ```json fence or not), as llama.cpp's own parser of this format takes it:
    Qwen2.5-Coder, for one, answers a call without the tags. Either counts only when it
    names a listed function with object arguments; anything else is text. Text that may
    still become a call (an open tag or object, a fence) is held until it is decided."""

    tools: tuple[FunctionTool, ...]
    held: str = ""  # text not yet emitted: from where a call may begin
    calls: int = 0
    _names: frozenset[str] = field(default_factory=frozenset)
    # the engine's grammar holds the answer (a forced call, or a lazy one begun): a call
    # is then streamed as it is written, its arguments fragment by fragment
    live: bool = False
    _open: _Live | None = None  # the call being streamed
    _head: re.Pattern[str] | None = None

    def __post_init__(self) -> None:
        self._names = frozenset(t.name for t in self.tools)
        self._head = re.compile(r'(<tool_call>\s*|```(?:json|xml)?\n\s*)?\{\s*"name"\s*:\s*('
                                + (_names(self.tools) or "(?!)") + ")")

    def feed(self, text: str, live: bool = False) -> tuple[str, tuple[ToolCallDelta, ...]]:
        """Content to emit now and the tool-call deltas completed by `text`; `live`: the
        engine's grammar held the tokens of `text` (their call is sure to be valid)."""
        self.live = self.live or live
        self.held += text
        return self._scan(final=False)

    def finish(self) -> tuple[str, tuple[ToolCallDelta, ...]]:
        """At the end: the rest, as content and the last calls. A fenced call whose closing
        fence never came still counts; an unfinished block or object is text (a streamed
        call cut short stays a call: its fragments are out, as OpenAI's are at `length`)."""
        text, deltas = self._scan(final=True)
        text, self.held = text + self.held, ""
        self._open = None
        return text, deltas

    def _scan(self, final: bool) -> tuple[str, tuple[ToolCallDelta, ...]]:
        s = self.held
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        done = 0  # s[:done] is decided
        if self._open is not None:
            done, still_open = self._stream(s, 0, final, deltas)
            if still_open:  # what is left is its unfinished end
                self.held = s[done:]
                return "", _joined(deltas)
        i = done
        while True:
            i = _next_start(s, i)
            if i < 0:
                break
            found = self._call_at(s, i, final)
            if found is None and self.live and not final:
                head = self._head.match(s, i) if self._head is not None else None
                if head is not None:  # a valid call begun: stream it from here
                    content.append(s[done:i])
                    index, self.calls = self.calls, self.calls + 1
                    deltas.append(ToolCallDelta(index, new_id("call"), "function",
                                                json.loads(head.group(2)), ""))
                    kind = "bare" if head.group(1) is None else (
                        "block" if head.group(1).startswith(OPEN) else "fenced")
                    self._open = _Live(index, kind)
                    done, still_open = self._stream(s, head.end(), final, deltas)
                    if still_open:
                        self.held = s[done:]
                        return "".join(content), _joined(deltas)
                    i = done
                    continue
            if found is None:  # may still become a call: hold from here
                break
            if found is False:
                i += 1
                continue
            end, call = found
            if call is None:  # a complete block or object that is no call: text
                i = end
                continue
            content.append(s[done:i])
            deltas.extend(self._deltas(*call))
            done = i = end
        stop = len(s) if i < 0 else i
        content.append(s[done:stop])
        self.held = s[stop:]
        return "".join(content), _joined(deltas)

    def _stream(self, s: str, k: int, final: bool,
                deltas: list[ToolCallDelta]) -> tuple[int, bool]:
        """The open call's text from `s[k]`: its arguments' characters as a fragment, then
        its end (the call object's `}`, and `</tool_call>` or a fence after it), held until
        whole. Where it has consumed to, and whether the call is still open."""
        live = self._open
        assert live is not None
        if not live.args_begun:  # `, "arguments": ` (the grammar's): up to the object's `{`
            brace = s.find("{", k)
            if brace < 0:
                return k, True
            k, live.args_begun = brace, True
        start = k
        if not live.args_done:  # the arguments object
            closed = live.args.close(s, k)
            live.args_done = closed >= 0
            k = closed if live.args_done else len(s)
        if k > start:
            deltas.append(ToolCallDelta(live.index, arguments=s[start:k]))
        if not live.args_done:
            return k, True
        end = _call_end(s, k, live.kind, final)
        if end is None:  # its end is still coming
            return k, True
        self._open = None
        return end, False

    def _call_at(self, s: str, i: int, final: bool
                 ) -> tuple[int, _Call | None] | Literal[False] | None:
        """At `s[i]` (a '<', '{' or '`'): None while more text could decide; False if no
        call begins here; else where the block or object ends, and its call (None: it is
        none)."""
        if s[i] == "<":
            if not s.startswith(OPEN, i):
                return None if OPEN.startswith(s[i:]) and not final else False
            end = s.find(CLOSE, i)
            if end < 0:
                if not final:
                    return None
                # cut short (max_tokens): a whole call inside still counts; else all text
                j = len(s) - len(s[i + len(OPEN):].lstrip())
                close = _object_end(s, j) if s.startswith("{", j) else None
                call = self._call(s[j:close]) if close is not None else None
                return (close, call) if close is not None and call is not None else (len(s), None)
            end += len(CLOSE)
            return end, self._call(s[i + len(OPEN): end - len(CLOSE)])
        head = _bare_head(s, i)
        if head is None:
            return None if not final else False
        if head is False:
            return False
        fenced, brace = head
        close = _object_end(s, brace)
        if close is None:
            return None if not final else False
        call = self._call(s[brace:close])
        if call is None:  # an object, but no call: text, up to its end
            return close, None
        end = close
        if fenced:  # the fence closes after the object (it may not come)
            rest = s[close:]
            body = rest.lstrip()
            if body.startswith(FENCE):
                end = close + len(rest) - len(body) + len(FENCE)
            elif not final and FENCE.startswith(body):
                return None
        return end, call

    def _call(self, body: str) -> _Call | None:
        """The function named and its arguments, if `body` is a call of a listed one."""
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
        return obj["name"], args

    def _deltas(self, name: str, args: dict[str, Any]) -> tuple[ToolCallDelta, ...]:
        index, self.calls = self.calls, self.calls + 1
        # the call is whole when it is parsed: one fragment with id, type, name and all its
        # arguments (two fragments of one index in one chunk, as this sent before, lose the
        # arguments for a client that reads `tool_calls[0]`)
        return (ToolCallDelta(index, new_id("call"), "function", name,
                              json.dumps(args, ensure_ascii=False)),)


@dataclass
class _Live:
    """A call streamed as it is written: its index, how it began (a `<tool_call>` block,
    a fenced or a bare object) and where its arguments' scan stands."""

    index: int
    kind: str
    args_begun: bool = False
    args: _Brackets = field(default_factory=lambda: _Brackets())
    args_done: bool = False


def _call_end(s: str, k: int, kind: str, final: bool) -> int | None:
    """After a streamed call's arguments at `s[k]`: the index after the call's end (the
    object's `}`, then `</tool_call>` for a block, or a closing fence, which may not come),
    None while it is still coming. Text the grammar would not have written ends the call
    where it stands (it stays content)."""
    j = len(s) - len(s[k:].lstrip())
    if j == len(s):
        return k if final else None
    if s[j] != "}":
        return k
    j += 1
    if kind == "bare":
        return j
    rest = s[j:]
    body = rest.lstrip()
    tail = CLOSE if kind == "block" else FENCE
    if body.startswith(tail):
        return j + len(rest) - len(body) + len(tail)
    if tail.startswith(body) and not final:
        return None
    return j


def _joined(deltas: list[ToolCallDelta]) -> tuple[ToolCallDelta, ...]:
    """One fragment per call in a chunk: a call's header and its arguments' pieces joined
    (two fragments of one index in one chunk lose the arguments for a client that reads
    `tool_calls[0]`)."""
    out: list[ToolCallDelta] = []
    for d in deltas:
        if out and out[-1].index == d.index and d.id is None:
            last = out[-1]
            out[-1] = ToolCallDelta(last.index, last.id, last.type, last.name,
                                    (last.arguments or "") + (d.arguments or ""))
        else:
            out.append(d)
    return tuple(out)


_Call = tuple[str, dict[str, Any]]  # a function's name and its arguments
FENCE = "```"
_FENCES = ("```json\n", "```xml\n", "```\n")
_NAME = '"name"'


def _next_start(s: str, i: int) -> int:
    """The first index from `i` where a call may begin ('<', '{' or '`'), or -1."""
    found = [at for at in (s.find("<", i), s.find("{", i), s.find("`", i)) if at >= 0]
    return min(found) if found else -1


def _bare_head(s: str, i: int) -> tuple[bool, int] | Literal[False] | None:
    """Whether a bare call begins at `s[i]`: an optional fence, then `{` and `"name"`
    (whitespace between). (fenced, index of the `{`) once that much is there; None
    while more text could decide; False if not."""
    k = i
    fenced = s[i] == "`"
    if fenced:
        for fence in _FENCES:
            if s.startswith(fence, i):
                k = i + len(fence)
                break
            if fence.startswith(s[i:]):
                return None
        else:
            return False
    while k < len(s) and s[k].isspace():
        k += 1
    if k == len(s):
        return None
    if s[k] != "{":
        return False
    brace = k
    k += 1
    while k < len(s) and s[k].isspace():
        k += 1
    tail = s[k: k + len(_NAME)]
    if not _NAME.startswith(tail):
        return False
    return (fenced, brace) if len(tail) == len(_NAME) else None


def _object_end(s: str, brace: int) -> int | None:
    """The index after the JSON object that opens at `s[brace]`, or None if it is not
    closed yet."""
    end = _Brackets().close(s, brace)
    return None if end < 0 else end


@dataclass
class _Brackets:
    """Where a JSON value's brackets stand, read in pieces (strings and escapes skipped;
    validity is json.loads's to say)."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False

    def close(self, s: str, k: int) -> int:
        """Read `s` from `k`: the index after the bracket that closes the value, or -1 when
        `s` ends first (the state is kept for the next piece)."""
        for j in range(k, len(s)):
            ch = s[j]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return j + 1
        return -1
