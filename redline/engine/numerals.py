"""The JSON numerals whose value lies in a range, as a regular language for the grammar.

`numerals(low, high, integer)` builds the language as a small expression tree; `gbnf()`
writes it for llama.cpp's grammar, `regex()` as a Python regular expression (the tests check
the tree through it against exact arithmetic, and the GBNF against llama.cpp itself).

The numerals: an optional `-`, never on a zero (no `-0`, `-0.0`); an integer part without
leading zeros; for a `number`, optionally `.` and at least one fraction digit; no exponent.
At most `DIGITS` (15) digits in all, integer and fraction part together: any decimal of 15
significant digits survives a round trip through a double, so distinct numerals parse to
distinct doubles in the same order, and a client that checks the bounds on doubles agrees
with this exact check. The integer part may be longer only where a bound is (up to
`MAX_WIDTH` digits; a larger upper bound is clipped there). Trailing fraction zeros are free:
`1.5`, `1.50` and `1.500` are all in when 1.5 is, and an exclusive bound excludes every
spelling of itself. The language is exactly the numerals of this form whose value is in range.

Construction, per length L of the integer part: the numerals of that length are the strings
of L + F digits (F: the fraction digits that length allows), read as integers scaled by
10^F, the bounds rounded inwards to that scale. The strings between two such integers are
the digit-by-digit range: a common prefix, then a branch on the first digit that differs
(the low string's digit and anything at or above its tail; the digits between, and then
anything; the high string's digit and anything at or below its tail). A fraction may stop
early wherever the digits it leaves out, zeros, keep the value in range. Every branch adds
one chain of at most L + F constant-size alternatives, so the grammar grows linearly in the
digits, and each alternative starts with its own digit: the language is parsed without
ambiguity, one integer length at a time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

DIGITS = 15
MAX_WIDTH = 64


@dataclass(frozen=True)
class Bound:
    """One end of a range: its exact value and whether the value itself is in."""

    value: Fraction
    inclusive: bool


@dataclass(frozen=True)
class Lit:
    text: str


@dataclass(frozen=True)
class Digits:
    """`least` to `most` digits, each from `low` to `high`."""

    low: int
    high: int
    least: int = 1
    most: int = 1


@dataclass(frozen=True)
class Seq:
    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Opt:
    part: Node


Node = Lit | Digits | Seq | Alt | Opt
EMPTY = Seq(())


def numerals(low: Bound | None, high: Bound | None, integer: bool) -> Node | None:
    """The numerals (see the module docstring) of the values from `low` to `high` (None:
    unbounded on that side), integers only if `integer`; None when there is none."""
    width = min(MAX_WIDTH, max(DIGITS, *(_int_digits(b.value) for b in (low, high) if b)))
    options: list[Node] = []
    if low is None or low.value < 0:
        # negatives: "-" and a magnitude above zero
        least = (Bound(-high.value, high.inclusive) if high is not None and high.value < 0
                 else Bound(Fraction(0), False))
        most = None if low is None else Bound(-low.value, low.inclusive)
        if (negative := _magnitudes(least, most, integer, width)) is not None:
            options.append(seq(Lit("-"), negative))
    if high is None or high.value >= 0:
        least = low if low is not None and low.value >= 0 else Bound(Fraction(0), True)
        if (positive := _magnitudes(least, high, integer, width)) is not None:
            options.append(positive)
    return alt(*options) if options else None


def gbnf(node: Node) -> str:
    """`node` as a GBNF expression."""
    if isinstance(node, Lit):
        return f'"{node.text}"'  # digits, "-" and ".": nothing to escape
    if isinstance(node, Digits):
        one = f'"{node.low}"' if node.low == node.high else f"[{node.low}-{node.high}]"
        return one + _times(node.least, node.most)
    if isinstance(node, Seq):
        return " ".join(f"( {gbnf(p)} )" if isinstance(p, Alt) else gbnf(p)
                        for p in node.parts)
    if isinstance(node, Alt):
        return " | ".join(gbnf(o) for o in node.options)
    return f"( {gbnf(node.part)} )?"


def regex(node: Node) -> str:
    """`node` as a Python regular expression (to match whole: `re.fullmatch`)."""
    if isinstance(node, Lit):
        return re.escape(node.text)
    if isinstance(node, Digits):
        one = str(node.low) if node.low == node.high else f"[{node.low}-{node.high}]"
        return one + _times(node.least, node.most)
    if isinstance(node, Seq):
        return "".join(f"(?:{regex(p)})" if isinstance(p, Alt) else regex(p)
                       for p in node.parts)
    if isinstance(node, Alt):
        return "|".join(regex(o) for o in node.options)
    return f"(?:{regex(node.part)})?"


def seq(*parts: Node) -> Node:
    """`parts` in a row, flattened; neighbouring literals, and digit runs of one class,
    merged."""
    out: list[Node] = []
    for part in parts:
        for p in part.parts if isinstance(part, Seq) else (part,):
            last = out[-1] if out else None
            if isinstance(p, Lit) and isinstance(last, Lit):
                out[-1] = Lit(last.text + p.text)
            elif (isinstance(p, Digits) and isinstance(last, Digits)
                  and (p.low, p.high) == (last.low, last.high)):
                out[-1] = Digits(p.low, p.high, last.least + p.least, last.most + p.most)
            elif not (isinstance(p, Digits) and p.most == 0):
                out.append(p)
    return out[0] if len(out) == 1 else Seq(tuple(out))


def alt(*options: Node) -> Node:
    flat = tuple(o for option in options
                 for o in (option.options if isinstance(option, Alt) else (option,)))
    return flat[0] if len(flat) == 1 else Alt(flat)


def opt(part: Node) -> Node:
    if part == EMPTY:
        return EMPTY
    if isinstance(part, Digits) and part.least == 1:
        return Digits(part.low, part.high, 0, part.most)
    return Opt(part)


def _magnitudes(low: Bound, high: Bound | None, integer: bool, width: int) -> Node | None:
    """Unsigned numerals from `low` to `high` (None: up to `width` integer digits)."""
    options: list[Node] = []
    # integer lengths whose every numeral is in (zero aside), without fraction: one rule
    run: tuple[int, int] | None = None
    for length in range(1, width + 1):
        frac = 0 if integer else max(0, DIGITS - length)
        first, last = (0 if length == 1 else 10 ** (length - 1 + frac)), 10 ** (length + frac) - 1
        lo = max(first, _ceil(low, 10 ** frac))
        hi = last if high is None else min(last, _floor(high, 10 ** frac))
        if (hi, frac) == (last, 0) and lo in (first, max(first, 1)):
            if lo == 0:
                options.append(Lit("0"))
            run = (run[0] if run else length, length)
            continue
        if run:
            options.append(_all_of(*run))
            run = None
        if lo <= hi:
            size = length + frac
            options.append(_spell(str(lo).zfill(size), str(hi).zfill(size), length))
    if run:
        options.append(_all_of(*run))
    return alt(*options) if options else None


def _all_of(shortest: int, longest: int) -> Node:
    """Every integer of `shortest` to `longest` digits but zero."""
    return seq(Digits(1, 9), Digits(0, 9, shortest - 1, longest - 1))


def _ceil(bound: Bound, scale: int) -> int:
    """The least integer above `bound` (or at it, if inclusive) at `scale`."""
    v = bound.value * scale
    return math.ceil(v) if bound.inclusive else math.floor(v) + 1


def _floor(bound: Bound, scale: int) -> int:
    v = bound.value * scale
    return math.floor(v) if bound.inclusive else math.ceil(v) - 1


def _spell(low: str, high: str, whole: int) -> Node:
    """The spellings of the digit strings from `low` to `high` (of one length): the first
    `whole` digits are the integer part, the rest the fraction, which may stop early where
    the digits it leaves out (zeros) keep the value in range."""
    if whole:
        return _branch(low, high, lambda lo, hi: _spell(lo, hi, whole - 1))
    if not low:
        return EMPTY
    fraction = seq(Lit("."), _fraction(low, high))
    return opt(fraction) if _zeros(low) else fraction


def _fraction(low: str, high: str) -> Node:
    """At least one of the fraction digits from `low` to `high`, stopping where allowed."""
    if _zeros(low) and set(high) == {"9"}:
        return Digits(0, 9, 1, len(low))
    if _zeros(high):
        return Digits(0, 0, 1, len(low))

    def rest(lo: str, hi: str) -> Node:
        if not lo:
            return EMPTY
        return opt(_fraction(lo, hi)) if _zeros(lo) else _fraction(lo, hi)
    return _branch(low, high, rest)


def _branch(low: str, high: str, after: Callable[[str, str], Node]) -> Node:
    """A first digit from low[0] to high[0], then `after` the tails that digit leaves."""
    a, b, lo, hi = int(low[0]), int(high[0]), low[1:], high[1:]
    if a == b:
        return seq(Lit(low[0]), after(lo, hi))
    zeros, nines = "0" * len(lo), "9" * len(lo)
    start, end = (a if lo == zeros else a + 1), (b if hi == nines else b - 1)
    options = []
    if start > a:
        options.append(seq(Lit(low[0]), after(lo, nines)))
    if start <= end:
        options.append(seq(Digits(start, end), after(zeros, nines)))
    if end < b:
        options.append(seq(Lit(high[0]), after(zeros, hi)))
    return alt(*options)


def _zeros(digits: str) -> bool:
    return set(digits) <= {"0"}


def _int_digits(value: Fraction) -> int:
    return len(str(math.floor(abs(value))))


def _times(least: int, most: int) -> str:
    if (least, most) == (1, 1):
        return ""
    if (least, most) == (0, 1):
        return "?"
    return f"{{{least}}}" if least == most else f"{{{least},{most}}}"
