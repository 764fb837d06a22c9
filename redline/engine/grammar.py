"""JSON Schema to GBNF for the embedded engine's constrained sampling.

llama-cpp-python's converter (`llama_grammar.SchemaConverter`) does the translation; this
module decides first which schemas it can enforce. Its converter ignores number bounds and
`assert`s on what it does not know, so a keyword outside `_ENFORCED` (or a pattern it
cannot parse) is a 400 naming the request field, never a silently unconstrained answer.

It is extended for numeric bounds: `minimum`, `maximum`, `exclusiveMinimum` and
`exclusiveMaximum` on an `integer` or a `number` (or an untyped schema alone, read as a
number), one-sided or two, decimal or not, become a rule for exactly the numerals in range
(`numerals.py`: plain decimals, at most 15 digits, no exponent; an integer has no fraction).
Beside `enum`/`const` they filter the values instead. Refused with a 400: bounds that are
not finite numbers, bounds that admit no value (a minimum above the maximum, an enum or
const wholly outside), and bounds beside `anyOf`/`oneOf`/`$ref` (the converter would drop
them). `multipleOf` stays refused, as every keyword outside `_ENFORCED`.
"""

from __future__ import annotations

import functools
import json
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

from llama_cpp import llama_grammar

from redline.engine import numerals, regex
from redline.engine.numerals import Bound
from redline.errors import InvalidRequest

# a JSON object and nothing around it; whitespace is at most one space (an unbounded
# whitespace rule lets a small model run away in newlines)
JSON_OBJECT = r"""root ::= object
value ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ( "," ws string ":" ws value )* )? "}" ws
array ::= "[" ws ( value ( "," ws value )* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\"" ws
number ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )? ws
ws ::= " "?
"""

# keywords that only annotate: no constraint to enforce
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id",
                          "$comment", "deprecated", "readOnly", "writeOnly"})
# keywords the converter enforces
_ENFORCED = frozenset({"type", "properties", "required", "additionalProperties", "items",
                       "prefixItems", "minItems", "maxItems", "enum", "const", "anyOf",
                       "oneOf", "$ref", "$defs", "definitions", "minLength", "maxLength",
                       "format", "pattern"})
_FORMATS = frozenset({"date", "time", "date-time", "uuid"})
_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# where a lowered schema carries its range (a numerals tree, never JSON: no request can
# hold it, and `_lowered` refuses the key itself as an unknown keyword)
_NUMERALS = "x-redline-numerals"


def schema_grammar(schema: dict[str, Any], param: str) -> str:
    """GBNF for `schema` (root rule `root`), or InvalidRequest(param) naming what the
    engine cannot enforce."""
    return _cached(json.dumps(schema, sort_keys=True), param)


@functools.lru_cache(maxsize=256)
def _cached(canonical: str, param: str) -> str:
    conv: Any = converter()
    rule = visit(conv, json.loads(canonical), "", param)
    if rule != "root":
        conv._add_rule("root", rule)  # noqa: SLF001 (the converter's own rule table)
    return text(conv)


def text(conv: Any) -> str:
    """The converter's grammar, its string characters made JSON's: this version's `char`
    rule admits raw control characters, which no JSON parser takes in a string."""
    return str(conv.format_grammar()).replace(_LOOSE_CHAR, _JSON_CHAR)


_LOOSE_CHAR = r'char ::= [^"\\] |'
_JSON_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] |'


def converter() -> Any:
    """A fresh llama-cpp-python SchemaConverter that knows numeric ranges (untyped: Any)."""
    make: Any = _Converter
    return make(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


class _Converter(llama_grammar.SchemaConverter):
    """The converter, taught the ranges `_lowered` leaves: it visits properties, items,
    alternatives and $refs through `visit`, so a range anywhere becomes its rule."""

    def visit(self, schema: Any, name: str) -> Any:
        base: Any = super()  # the converter's methods carry no types
        node = schema.get(_NUMERALS) if isinstance(schema, dict) else None
        if node is None:
            return base.visit(schema, name)
        # named as the converter names a primitive's rule
        rule = name + "-" if name in llama_grammar.RESERVED_NAMES else name or "root"
        body = numerals.gbnf(node)
        return base._add_rule(rule, f"( {body} ) space" if isinstance(node, numerals.Alt)
                              else f"{body} space")

    def _visit_pattern(self, pattern: str, name: str) -> Any:
        """A string `pattern` matches, as JSON Schema reads it (anywhere in the string
        unless anchored), by redline's translation (regex.py): the converter's own writes
        `\\d` and `\\w` as letters and lets `.` take a raw `"`."""
        body = regex.expression(pattern, json_string=True, search=True)
        base: Any = super()
        return base._add_rule(name, f'"\\"" {body} "\\"" space')


def visit(conv: Any, schema: Any, name: str, param: str) -> str:
    """Add `schema`'s rules to `conv` under `name`; the name of its rule."""
    schema = _lowered(schema, param, "")
    try:
        schema = conv.resolve_refs(schema, "input")
        return str(conv.visit(schema, name))
    except (AssertionError, ValueError, KeyError, TypeError, IndexError,
            RecursionError) as exc:
        raise InvalidRequest(f"'{param}': the embedded engine cannot enforce this schema "
                             f"({exc or type(exc).__name__}).", param=param) from exc


def _lowered(schema: Any, param: str, where: str) -> Any:
    """`schema` checked keyword by keyword, numeric bounds turned into ranges."""
    if isinstance(schema, bool):
        if schema:
            return {}
        raise InvalidRequest(f"'{param}': a `false` schema{_at(where)} admits nothing.",
                             param=param)
    if not isinstance(schema, dict):
        raise InvalidRequest(f"'{param}': not a schema object{_at(where)}.", param=param)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _ANNOTATIONS:
            continue
        if key in _BOUNDS:
            continue  # handled with the type below
        if key not in _ENFORCED:
            raise InvalidRequest(f"'{param}': the embedded engine cannot enforce the JSON "
                                 f"Schema keyword `{key}`{_at(where)}.", param=param)
        out[key] = value
    kind = out.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if any(k is not None and k not in _TYPES for k in kinds):
        raise InvalidRequest(f"'{param}': unknown type {kind!r}{_at(where)}.", param=param)
    _check_combination(out, param, where)
    if isinstance(kind, list):  # the converter drops a list type's other keywords: one each
        rest = {k: v for k, v in schema.items() if k not in ("type", "$defs", "definitions")}
        defs = {k: out[k] for k in ("$defs", "definitions") if k in out}
        alts = [_lowered({**_applying(rest, k), "type": k}, param, f"{where}/type/{k}")
                for k in kind]
        return _lowered(defs, param, where) | {"anyOf": alts}
    if "format" in out and out["format"] not in _FORMATS:
        raise InvalidRequest(f"'{param}': the embedded engine cannot enforce the string "
                             f"format `{out['format']}`{_at(where)}.", param=param)
    if "pattern" in out and not isinstance(out["pattern"], str):
        raise InvalidRequest(f"'{param}': a `pattern` must be a string{_at(where)}.",
                             param=param)
    bounds = {k: schema[k] for k in _BOUNDS if k in schema}
    if bounds:
        out = _bounded(out, bounds, param, where)
    for key in ("properties", "$defs", "definitions"):
        if isinstance(out.get(key), dict):
            out[key] = {k: _lowered(v, param, f"{where}/{key}/{k}") for k, v in out[key].items()}
    if isinstance(out.get("items"), dict | bool):
        out["items"] = _lowered(out["items"], param, f"{where}/items")
    for key in ("prefixItems", "anyOf", "oneOf"):
        if isinstance(out.get(key), list):
            out[key] = [_lowered(v, param, f"{where}/{key}/{i}") for i, v in enumerate(out[key])]
    extra = out.get("additionalProperties")
    if isinstance(extra, dict):
        out["additionalProperties"] = _lowered(extra, param, f"{where}/additionalProperties")
    return out


# keywords the converter honours only alone: with these beside them, it would silently drop
# the others (say a maxLength beside a pattern), so such a schema is refused
_DROPPED_BESIDE = {
    "anyOf": {"properties", "items", "prefixItems", "enum", "const", "minLength", "maxLength",
              "pattern", "format", "minItems", "maxItems", "oneOf", "$ref"},
    "oneOf": {"properties", "items", "prefixItems", "enum", "const", "minLength", "maxLength",
              "pattern", "format", "minItems", "maxItems", "$ref"},
    "$ref": {"properties", "items", "prefixItems", "enum", "const", "minLength", "maxLength",
             "pattern", "format", "minItems", "maxItems", "type", "required",
             "additionalProperties"},
    "pattern": {"minLength", "maxLength", "format"},
    "format": {"minLength", "maxLength"},
    "prefixItems": {"minItems", "maxItems", "items"},
}


# keywords that apply to one kind of value only (JSON Schema ignores them on others)
_ONLY_FOR = {**dict.fromkeys(("minLength", "maxLength", "pattern", "format"), ("string",)),
             **dict.fromkeys(_BOUNDS, ("number", "integer")),
             **dict.fromkeys(("items", "prefixItems", "minItems", "maxItems"), ("array",)),
             **dict.fromkeys(("properties", "required", "additionalProperties"), ("object",))}


def _applying(schema: dict[str, Any], kind: str) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if kind in _ONLY_FOR.get(k, (kind,))}


def _check_combination(out: dict[str, Any], param: str, where: str) -> None:
    for key, dropped in _DROPPED_BESIDE.items():
        if key in out and (both := sorted(dropped & set(out))):
            raise InvalidRequest(f"'{param}': the embedded engine cannot enforce `{key}` "
                                 f"together with `{both[0]}`{_at(where)}.", param=param)


def _bounded(out: dict[str, Any], bounds: dict[str, Any], param: str,
             where: str) -> dict[str, Any]:
    """`out` with its bounds enforced: its enum or const filtered, or its numbers made
    the range's numerals."""
    low, high = _range(bounds, param, where)
    first = next(iter(bounds))
    if beside := [k for k in ("anyOf", "oneOf", "$ref") if k in out]:
        raise InvalidRequest(f"'{param}': the embedded engine cannot enforce `{first}` "
                             f"together with `{beside[0]}`{_at(where)}.", param=param)
    if "enum" in out or "const" in out:
        values = out["enum"] if "enum" in out else [out["const"]]
        if not isinstance(values, list):
            return out  # not a schema the API's check passes; the converter decides
        kept = [v for v in values if _inside(v, low, high)]
        if not kept:
            raise InvalidRequest(f"'{param}': the bounds admit no value of the "
                                 f"{'enum' if 'enum' in out else 'const'}{_at(where)}.",
                                 param=param)
        return out | ({"enum": kept} if "enum" in out else {})
    kind = out.get("type")
    defs = {k: v for k, v in out.items() if k in ("$defs", "definitions")}
    if kind not in ("number", "integer", None) or (kind is None and len(out) > len(defs)):
        return out  # the converter writes no number here: the bounds constrain nothing
    node = numerals.numerals(low, high, integer=kind == "integer")
    if node is None:
        raise InvalidRequest(f"'{param}': the bounds admit no {kind or 'number'} of at most "
                             f"{numerals.DIGITS} digits{_at(where)}.", param=param)
    return defs | {"type": kind or "number", _NUMERALS: node}


def _range(bounds: dict[str, Any], param: str, where: str) -> tuple[Bound | None, Bound | None]:
    """The lower and upper bound, each the tighter of its inclusive and exclusive form."""
    exact: dict[str, Fraction] = {}
    for key, value in bounds.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                isinstance(value, float) and not math.isfinite(value)):
            raise InvalidRequest(f"'{param}': `{key}` must be a finite number{_at(where)}.",
                                 param=param)
        exact[key] = _exact(value)
    lows = [Bound(exact[k], k == "minimum") for k in ("minimum", "exclusiveMinimum")
            if k in exact]
    highs = [Bound(exact[k], k == "maximum") for k in ("maximum", "exclusiveMaximum")
             if k in exact]
    # the tighter end; at a tie, the exclusive one
    low = max(lows, key=lambda b: (b.value, not b.inclusive), default=None)
    high = min(highs, key=lambda b: (b.value, b.inclusive), default=None)
    if low is not None and high is not None and (
            low.value > high.value
            or (low.value == high.value and not (low.inclusive and high.inclusive))):
        raise InvalidRequest(f"'{param}': the bounds admit no value: the lower bound "
                             f"{_shown(low.value)} is not below the upper bound "
                             f"{_shown(high.value)}{_at(where)}.", param=param)
    return low, high


def _inside(value: Any, low: Bound | None, high: Bound | None) -> bool:
    """Whether `value` keeps to the bounds (any non-number does: bounds are for numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return True
    if isinstance(value, float) and not math.isfinite(value):
        return False
    v = _exact(value)
    return ((low is None or v > low.value or (v == low.value and low.inclusive))
            and (high is None or v < high.value or (v == high.value and high.inclusive)))


def _exact(value: int | float) -> Fraction:
    """A JSON number's exact value: a float as the decimal that was written (its shortest
    repr), not its binary expansion."""
    return Fraction(value) if isinstance(value, int) else Fraction(Decimal(repr(value)))


def _shown(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(Decimal(value.numerator)
                                                                   / value.denominator)


def _at(where: str) -> str:
    return f" (at `{where}`)" if where else ""
