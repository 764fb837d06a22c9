"""JSON Schema to GBNF for the embedded engine's constrained sampling.

llama-cpp-python's converter (`llama_grammar.SchemaConverter`) does the translation; this
module decides first which schemas it can enforce. Its converter ignores number bounds and
`assert`s on what it does not know, so a keyword outside `_ENFORCED` (or a pattern it
cannot parse) is a 400 naming the request field, never a silently unconstrained answer.

It is extended for integer bounds: an integer with `minimum`/`maximum` (or the exclusive
forms, decimal bounds rounded inwards) spanning at most `_MAX_INT_RANGE` values becomes the
enum of those values. Bounds on a `number` (or beside `enum`/`const`) are refused with a 400
naming the keyword.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

from llama_cpp import llama_grammar

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
_MAX_INT_RANGE = 1000


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
    """A fresh llama-cpp-python SchemaConverter (untyped: Any here)."""
    make: Any = llama_grammar.SchemaConverter
    return make(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


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
    """`schema` checked keyword by keyword, integer bounds turned into enums."""
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
    if "pattern" in out and (not isinstance(out["pattern"], str)
                             or not (out["pattern"].startswith("^")
                                     and out["pattern"].endswith("$"))):
        raise InvalidRequest(f"'{param}': a `pattern` must be anchored with ^ and $ for the "
                             f"embedded engine{_at(where)}.", param=param)
    bounds = {k: schema[k] for k in _BOUNDS if k in schema}
    if bounds:
        out = _integer_enum(out, bounds, param, where)
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


def _integer_enum(out: dict[str, Any], bounds: dict[str, Any], param: str,
                  where: str) -> dict[str, Any]:
    if out.get("type") != "integer" or "enum" in out or "const" in out:
        # a decimal range has no finite enum: refused, never an unbounded number
        keys = ", ".join(f"`{k}`" for k in bounds)
        what = f"a `{out['type']}`" if out.get("type") else "an untyped"
        raise InvalidRequest(f"'{param}': the embedded engine enforces `minimum`/`maximum` on "
                             f"integers only, not {keys} on {what} value{_at(where)}.",
                             param=param)
    low = bounds.get("minimum", -math.inf)
    if "exclusiveMinimum" in bounds:
        low = max(low, math.floor(bounds["exclusiveMinimum"]) + 1)
    high = bounds.get("maximum", math.inf)
    if "exclusiveMaximum" in bounds:
        high = min(high, math.ceil(bounds["exclusiveMaximum"]) - 1)
    if not (math.isfinite(low) and math.isfinite(high)) or high - low >= _MAX_INT_RANGE:
        raise InvalidRequest(f"'{param}': the embedded engine enforces integer bounds with "
                             f"both ends and at most {_MAX_INT_RANGE} values{_at(where)}.",
                             param=param)
    values = list(range(math.ceil(low), math.floor(high) + 1))
    if not values:
        raise InvalidRequest(f"'{param}': the integer bounds admit no value{_at(where)}.",
                             param=param)
    return {k: v for k, v in out.items() if k != "type"} | {"enum": values}


def _at(where: str) -> str:
    return f" (at `{where}`)" if where else ""
