"""Regular expressions as GBNF: vLLM's `regex` structured output and JSON Schema's `pattern`
on the embedded engine.

Python's own parser (`re._parser`) reads the pattern, so the syntax is Python's, and this
module writes the language it parses as one GBNF expression, exactly where it can and with
a 400 where it cannot (never a looser grammar): literals, `.`, character classes with
ranges, negation and `\\d \\w \\s` (and their complements), groups, alternation, greedy and
lazy repetition (laziness changes a match, not the language), `^`/`\\A` at the start and
`$`/`\\Z` at the end, and the flags `i` (ASCII letters), `s`, `x`, `a`, `u`. Refused:
backreferences, lookarounds, word boundaries, anchors inside the pattern, possessive and
atomic repetition, the `m` and `L` flags, and a bound above `MAX_BOUND`.

Classes are ASCII, as in xgrammar and in ECMA-262's `\\d` and `\\w`: `\\d` is [0-9], `\\w`
[0-9A-Za-z_], `\\s` [\\t\\n\\v\\f\\r ]. Every character class is computed as a set of code
point ranges (a complement exactly, surrogates left out), so `[^...]`, `\\D`, `\\W` and
`\\S` are written as the ranges they leave, and an answer the grammar takes matches the
pattern under `re.ASCII`.

`json_string=True` writes the language inside a JSON string (JSON Schema's `pattern`): a
`"`, a backslash or a control character in the language is written as its JSON escape, so
the answer is valid JSON whose decoded string is in the language. `search=True` is JSON
Schema's reading (the pattern may match anywhere: an unanchored end is open to any text);
vLLM's regex is a full match (`search=False`), where `^` and `$` at the ends say nothing. A
final `$` is the end of the text, as ECMA-262 (JSON Schema's dialect) reads it, not also
before a final line break as Python's `re` does.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

# CPython's regular expression parser and its opcodes (the `sre_parse` module, under its
# current name): private, but the one parser that reads a pattern exactly as `re` does
_parser: Any = importlib.import_module("re._parser")
_c: Any = importlib.import_module("re._constants")

MAX_BOUND = 1000  # the largest repetition count taken (llama.cpp unrolls each one)
MAX_CODE = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)

Ranges = list[tuple[int, int]]  # sorted, disjoint, inclusive code point ranges

_DIGIT: Ranges = [(0x30, 0x39)]
_WORD: Ranges = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE: Ranges = [(0x09, 0x0D), (0x20, 0x20)]
# what a JSON string holds unescaped: no control character, no `"`, no backslash
_JSON_PLAIN: Ranges = [(0x20, 0x21), (0x23, 0x5B), (0x5D, MAX_CODE)]
_LINE_BREAK: Ranges = [(0x0A, 0x0A)]
_ALL: Ranges = [(0, MAX_CODE)]


class RegexError(ValueError):
    """A pattern that is not a regular expression, or that the grammar cannot hold."""


def expression(pattern: str, *, json_string: bool = False, search: bool = False) -> str:
    """A GBNF expression for the strings `pattern` matches (see the module's docstring)."""
    if not isinstance(pattern, str):
        raise RegexError("the pattern must be a string")
    try:
        parsed = _parser.parse(pattern, 0)
    except Exception as exc:  # re.error, and the parser's own RecursionError on deep nesting
        raise RegexError(f"not a regular expression: {exc}") from exc
    writer = _Writer(json_string)
    flags = _flags(int(parsed.state.flags), "the pattern")
    items = list(parsed.data)
    try:
        if len(items) == 1 and items[0][0] is _c.BRANCH:  # each alternative anchored apart
            return _group([writer.anchored(list(alt), flags, search)
                           for alt in items[0][1][1]])
        return writer.anchored(items, flags, search)
    except RecursionError as exc:
        raise RegexError("the pattern is nested too deeply") from exc


def _flags(flags: int, where: str) -> int:
    refused = {_c.SRE_FLAG_MULTILINE: "m (multiline)", _c.SRE_FLAG_LOCALE: "L (locale)"}
    for flag, name in refused.items():
        if flags & flag:
            raise RegexError(f"the flag {name} in {where} is not supported")
    return flags


class _Writer:
    def __init__(self, json_string: bool) -> None:
        self.json = json_string

    def anchored(self, items: list[Any], flags: int, search: bool) -> str:
        """A top-level sequence: its anchors at the ends taken off, and in search mode
        any text allowed at an unanchored end."""
        start = bool(items) and items[0] == (_c.AT, _c.AT_BEGINNING) or \
            bool(items) and items[0] == (_c.AT, _c.AT_BEGINNING_STRING)
        if start:
            items = items[1:]
        end = bool(items) and items[-1][0] is _c.AT and items[-1][1] in (_c.AT_END,
                                                                        _c.AT_END_STRING)
        if end:
            items = items[:-1]
        body, _ = self.sequence(items, flags)
        anything = f"{self.chars(_ALL)}*"
        parts = ([] if start or not search else [anything]) + ([body] if body else []) + \
            ([] if end or not search else [anything])
        return " ".join(parts) if parts else '""'

    def sequence(self, items: list[Any], flags: int) -> tuple[str, bool]:
        """The items in a row (`""` for none), and whether that is one GBNF item, which a
        repetition applies to whole (a literal of several characters is not)."""
        pieces: list[tuple[str, bool]] = []
        literal: list[int] = []
        for op, av in items + [(None, None)]:  # the end closes the last run of literals
            if op is _c.LITERAL and not (flags & _c.SRE_FLAG_IGNORECASE and _cased(av)):
                literal.append(av)
                continue
            if literal:
                written = self.literal(literal)
                pieces.append((written, len(_parsed_literal(written)) == 1))
                literal = []
            if op is not None:
                pieces.append(self.item(op, av, flags))
        if not pieces:
            return '""', False
        if len(pieces) == 1:
            return pieces[0]
        return " ".join(text for text, _ in pieces), False

    def one(self, items: list[Any], flags: int) -> str:
        """The items as one GBNF item."""
        text, single = self.sequence(items, flags)
        return text if single else _group([text])

    def item(self, op: Any, av: Any, flags: int) -> tuple[str, bool]:
        """One parsed node; whether it is one GBNF item (see `sequence`)."""
        if op is _c.LITERAL:
            return self.chars(_fold([(av, av)], flags)), True
        if op is _c.NOT_LITERAL:
            return self.chars(_complement(_fold([(av, av)], flags))), True
        if op is _c.ANY:
            dot = _ALL if flags & _c.SRE_FLAG_DOTALL else _complement(_LINE_BREAK)
            return self.chars(dot), True
        if op is _c.IN:
            return self.chars(_class(av, flags)), True
        if op is _c.BRANCH:
            return _group([self.sequence(list(alt), flags)[0] for alt in av[1]]), True
        if op is _c.SUBPATTERN:
            _, add, remove, sub = av
            return self.one(list(sub), (flags | _flags(add, "a group")) & ~remove), True
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):  # lazy or greedy: the same language
            low, high, sub = av
            unbounded = high is _c.MAXREPEAT or high == _c.MAXREPEAT
            if low > MAX_BOUND or (not unbounded and high > MAX_BOUND):
                raise RegexError(f"a repetition count above {MAX_BOUND} is not supported")
            body = self.one(list(sub), flags)
            if (low, unbounded) == (0, True):
                return f"{body}*", False
            if (low, unbounded) == (1, True):
                return f"{body}+", False
            if unbounded:
                return f"{body}{{{low},}}", False
            if (low, high) == (0, 1):
                return f"{body}?", False
            return f"{body}{{{low}}}" if low == high else f"{body}{{{low},{high}}}", False
        names = {_c.AT: "an anchor or word boundary inside the pattern",
                 _c.GROUPREF: "a backreference", _c.GROUPREF_EXISTS: "a conditional group",
                 _c.ASSERT: "a lookaround", _c.ASSERT_NOT: "a lookaround",
                 _c.POSSESSIVE_REPEAT: "a possessive repetition",
                 _c.ATOMIC_GROUP: "an atomic group"}
        raise RegexError(f"{names.get(op, str(op).lower())} is not supported")

    def literal(self, codes: list[int]) -> str:
        text = "".join(chr(c) for c in codes)
        if self.json:  # the string's JSON spelling: `"` and backslash and controls escaped
            text = json.dumps(text, ensure_ascii=False)[1:-1]
        return '"' + "".join(_escape(ord(ch), in_class=False) for ch in text) + '"'

    def chars(self, ranges: Ranges) -> str:
        """One character of `ranges`; in a JSON string, the ones that need it escaped."""
        ranges = _without(ranges, [_SURROGATES])
        escaped: list[str] = []
        if self.json:
            plain = _intersect(ranges, _JSON_PLAIN)
            escaped = _json_escapes([c for lo, hi in _without(ranges, _JSON_PLAIN)
                                     for c in range(lo, hi + 1)])
            ranges = plain
        if not ranges and not escaped:
            raise RegexError("a character class that matches no character")
        options = escaped
        if ranges:
            body = "".join(_escape(lo, in_class=True) if lo == hi else
                           f"{_escape(lo, in_class=True)}-{_escape(hi, in_class=True)}"
                           for lo, hi in ranges)
            options = [f"[{body}]", *escaped]
        if len(options) == 1 and (options[0].startswith("[") or
                                  len(_parsed_literal(options[0])) == 1):
            return options[0]
        return _group(options)


def _json_escapes(codes: list[int]) -> list[str]:
    """JSON's escapes for `codes` (controls, `"`, backslash), as GBNF options: each
    control both short (`\\n`), where JSON has one, and as `\\u00XX` in either case."""
    out = [f'"\\x5C{_escape(c, in_class=False)}"' for c in codes if c in (0x22, 0x5C)]
    short = "".join(letter for c, letter in ((8, "b"), (9, "t"), (10, "n"), (12, "f"),
                                             (13, "r")) if c in codes)
    if short:
        out.append(f'"\\x5C" [{short}]')
    for high in (0, 1):
        lows = sorted({c & 0xF for c in codes if c >> 4 == high and c < 0x20})
        digits = "".join(f"{low:x}" + (f"{low:X}" if low > 9 else "") for low in lows)
        if digits:
            out.append(f'"\\x5Cu00{high}" [{digits}]')
    return out


def _group(options: list[str]) -> str:
    return "( " + " | ".join(options) + " )"


def _parsed_literal(literal: str) -> str:
    """The characters a GBNF literal `"..."` (as `literal()` writes it) stands for."""
    body, out, i = literal[1:-1], [], 0
    while i < len(body):
        if body[i] == "\\":
            width = {"x": 2, "u": 4, "U": 8}[body[i + 1]]
            out.append(chr(int(body[i + 2:i + 2 + width], 16)))
            i += 2 + width
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


def _class(items: list[Any], flags: int) -> Ranges:
    negate = False
    ranges: Ranges = []
    for op, av in items:
        if op is _c.NEGATE:
            negate = True
        elif op is _c.LITERAL:
            ranges.append((av, av))
        elif op is _c.RANGE:
            ranges.append((av[0], av[1]))
        elif op is _c.CATEGORY:
            ranges += _category(av)
        else:
            raise RegexError(f"{str(op).lower()} in a character class is not supported")
    folded = _fold(_normal(ranges), flags)
    return _complement(folded) if negate else folded


def _category(name: Any) -> Ranges:
    base = {_c.CATEGORY_DIGIT: _DIGIT, _c.CATEGORY_WORD: _WORD, _c.CATEGORY_SPACE: _SPACE,
            _c.CATEGORY_NOT_DIGIT: _complement(_DIGIT), _c.CATEGORY_NOT_WORD: _complement(_WORD),
            _c.CATEGORY_NOT_SPACE: _complement(_SPACE)}
    if name not in base:
        raise RegexError(f"the class {str(name).lower()} is not supported")
    return base[name]


def _cased(code: int) -> bool:
    return 0x41 <= code <= 0x5A or 0x61 <= code <= 0x7A


def _fold(ranges: Ranges, flags: int) -> Ranges:
    """Under the `i` flag, the ranges with their ASCII letters' other case added."""
    if not flags & _c.SRE_FLAG_IGNORECASE:
        return ranges
    extra: Ranges = []
    for lo, hi in ranges:
        for a, b, shift in ((0x41, 0x5A, 0x20), (0x61, 0x7A, -0x20)):
            s, e = max(lo, a), min(hi, b)
            if s <= e:
                extra.append((s + shift, e + shift))
    return _normal(ranges + extra)


def _normal(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _complement(ranges: Ranges) -> Ranges:
    out: Ranges = []
    at = 0
    for lo, hi in _normal(ranges):
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    if at <= MAX_CODE:
        out.append((at, MAX_CODE))
    return out


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    return _complement(_normal(_complement(a) + _complement(b)))


def _without(a: Ranges, b: Ranges) -> Ranges:
    return _intersect(a, _complement(b))


def _escape(code: int, *, in_class: bool) -> str:
    """One code point as GBNF writes it in a literal or a class."""
    ch = chr(code)
    if ch.isascii() and (ch.isalnum() or ch in " _.,:;!?@#$%&'*+=<>/|~`{}()" or
                         (not in_class and ch in "-^[]")):
        return ch
    if code <= 0xFF:
        return f"\\x{code:02X}"
    if code <= 0xFFFF:
        return f"\\u{code:04X}"
    return f"\\U{code:08X}"
