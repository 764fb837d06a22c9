"""Fifty-seven (prompt, JSON Schema) pairs of varied shapes for the embedded engine's
structured outputs: nested objects, arrays with maxItems, enums, required and optional
fields, numbers, integers and numbers with bounds (decimal, exclusive, one-sided,
negative), booleans, strings with maxLength and formats, anyOf,
$defs/$ref, nullable types, const, tuples (prefixItems), and open objects."""

from __future__ import annotations

from typing import Any


def s(n: int = 24) -> dict[str, Any]:
    return {"type": "string", "maxLength": n}


def obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required,
            "additionalProperties": False}


INT = {"type": "integer"}
NUM = {"type": "number"}
BOOL = {"type": "boolean"}

SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("Describe a person.", obj({"name": s(), "age": INT})),
    ("Give a city and its country.", obj({"city": s(), "country": s()})),
    ("Is water wet?", obj({"answer": BOOL})),
    ("Rate a movie from 1 to 5.", obj({"title": s(), "stars": {"type": "integer", "minimum": 1,
                                                               "maximum": 5}})),
    ("Pick a color.", obj({"color": {"enum": ["red", "green", "blue"]}})),
    ("Give the price of a coffee.", obj({"item": s(), "price": NUM})),
    ("List up to three fruits.", obj({"fruits": {"type": "array", "items": s(16),
                                                 "maxItems": 3}})),
    ("Give a book with its author.", obj({"book": obj({"title": s(), "author": s()})})),
    ("Describe a point in 2D.", obj({"x": NUM, "y": NUM})),
    ("Name a weekday.", obj({"day": {"type": "string", "enum": [
        "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]}})),
    ("Give a user profile.", obj({"username": s(16), "email": s(32), "active": BOOL})),
    ("Describe the weather.", obj({"temp_c": NUM, "sky": {"enum": ["sunny", "cloudy", "rainy"]}})),
    ("Give a date for a meeting.", obj({"date": {"type": "string", "format": "date"}})),
    ("Give a product.", obj({"name": s(), "price": NUM, "in_stock": BOOL},
                            required=["name", "price"])),
    ("Give two tags.", obj({"tags": {"type": "array", "items": s(12), "minItems": 1,
                                     "maxItems": 2}})),
    ("Describe an address.", obj({"street": s(), "zip": s(10), "city": s(16)})),
    ("Give an order with items.", obj({"order_id": INT, "items": {
        "type": "array", "maxItems": 2, "items": obj({"sku": s(10), "qty": {
            "type": "integer", "minimum": 1, "maximum": 9}})}})),
    ("Say hello.", obj({"greeting": s(20)})),
    ("Give a percentage.", obj({"percent": {"type": "integer", "minimum": 0, "maximum": 100}})),
    ("Classify a review's sentiment.", obj({"sentiment": {"enum": ["positive", "negative",
                                                                   "neutral"]},
                                            "confidence": NUM})),
    ("Give a time of day.", obj({"time": {"type": "string", "format": "time"}})),
    ("Describe a pet.", obj({"pet": obj({"kind": {"enum": ["cat", "dog"]}, "name": s(12),
                                         "age": {"type": "integer", "minimum": 0,
                                                 "maximum": 30}})})),
    ("Give a yes/no flag and a reason.", obj({"ok": BOOL, "reason": s(40)})),
    ("Give a version number.", obj({"major": INT, "minor": INT, "patch": INT})),
    ("Give a nullable nickname.", obj({"nickname": {"type": ["string", "null"],
                                                    "maxLength": 12}})),
    ("Give an id or a name.", obj({"key": {"anyOf": [INT, s(12)]}})),
    ("Give a list of up to three numbers.", obj({"values": {"type": "array", "items": NUM,
                                                            "maxItems": 3}})),
    ("Give a status.", obj({"status": {"const": "ok"}, "code": INT})),
    ("Describe a team with a lead.", obj({"team": s(16), "lead": obj({"name": s(16),
                                                                      "email": s(24)})})),
    ("Give a coordinate pair.", obj({"pair": {"type": "array", "prefixItems": [NUM, NUM]}})),
    ("Give a language and a level.", obj({"language": s(16), "level": {
        "enum": ["A1", "A2", "B1", "B2", "C1", "C2"]}})),
    ("Give a uuid for a record.", obj({"id": {"type": "string", "format": "uuid"}})),
    ("Describe a rectangle.", obj({"width": NUM, "height": NUM, "unit": {"enum": ["cm", "m"]}})),
    ("Give a task.", obj({"title": s(), "done": BOOL, "priority": {
        "type": "integer", "minimum": 1, "maximum": 3}})),
    ("Give a score out of ten.", obj({"score": {"type": "integer", "minimum": 0,
                                                "exclusiveMaximum": 11}})),
    ("Name a planet.", {"type": "string", "enum": ["Mercury", "Venus", "Earth", "Mars"]}),
    ("Give a number.", {"type": "integer", "minimum": 1, "maximum": 50}),
    ("Give a list of two words.", {"type": "array", "items": s(12), "minItems": 2,
                                   "maxItems": 2}),
    ("Give a timestamp for an event.", obj({"event": s(20), "at": {"type": "string",
                                                                   "format": "date-time"}})),
    ("Describe a shape by $ref.", {"$defs": {"pt": obj({"x": INT, "y": INT})},
                                   "type": "object", "properties": {
                                       "start": {"$ref": "#/$defs/pt"},
                                       "end": {"$ref": "#/$defs/pt"}},
                                   "required": ["start", "end"],
                                   "additionalProperties": False}),
    ("Give optional contact info.", obj({"phone": s(16), "email": s(24)}, required=[])),
    ("Give a recipe with ingredients.", obj({"dish": s(20), "ingredients": {
        "type": "array", "maxItems": 3, "items": s(16)}})),
    ("Give a chess move.", obj({"piece": {"enum": ["K", "Q", "R", "B", "N", "P"]},
                                "square": {"type": "string", "pattern": "^[a-h][1-8]$"}})),
    ("Give a phone number.", obj({"phone": {"type": "string", "pattern": r"^\d{3}-\d{4}$"}})),
    ("Give a product code and name.", obj({"sku": {"type": "string",
                                                   "pattern": r"^[A-Z]{3}-\d{3}$"},
                                           "name": s(16)})),
    ("Give an HTTP response.", obj({"status": {"type": "integer", "minimum": 100,
                                               "maximum": 599}, "body": s(30)})),
    ("Describe a matrix row.", obj({"row": {"type": "array", "items": INT, "maxItems": 4}})),
    ("Give a boolean list.", obj({"flags": {"type": "array", "items": BOOL, "maxItems": 3}})),
    ("Give a key-value setting.", obj({"key": s(16), "value": {"anyOf": [s(16), NUM, BOOL]}})),
    ("Give any small JSON object about a car.", {"type": "object", "properties": {
        "make": s(16)}, "required": ["make"], "additionalProperties": False}),
    ("Give nested settings.", obj({"display": obj({"theme": {"enum": ["light", "dark"]},
                                                   "font_size": {"type": "integer",
                                                                 "minimum": 8,
                                                                 "maximum": 32}}),
                                   "sound": obj({"volume": {"type": "integer", "minimum": 0,
                                                            "maximum": 10}, "muted": BOOL})})),
    ("Give a person with hobbies.", obj({"name": s(16), "hobbies": {
        "type": "array", "maxItems": 2, "items": obj({"hobby": s(16), "years": {
            "type": "integer", "minimum": 0, "maximum": 50}})}})),
    # numeric bounds beyond a small integer range: decimal, exclusive, one-sided, negative
    ("Give the price of a book.", obj({"title": s(), "price": {
        "type": "number", "minimum": 0.5, "maximum": 99.95}})),
    ("Give a probability.", obj({"p": {"type": "number", "exclusiveMinimum": 0,
                                       "exclusiveMaximum": 1}})),
    ("Give a count of visitors.", obj({"visitors": {"type": "integer", "minimum": 1}})),
    ("Give a winter temperature in Celsius.", obj({"temp_c": {
        "type": "number", "minimum": -40.5, "exclusiveMaximum": -2.5}})),
    ("Give a depth below sea level in metres.", obj({"depth": {"type": "integer",
                                                               "maximum": -3}})),
    ("Give a GPS position.", obj({"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                  "lon": {"type": "number", "exclusiveMinimum": -180,
                                          "maximum": 180}})),
    ("Give a rating with halves.", obj({"rating": {"type": ["number", "null"],
                                                   "minimum": 0.5, "maximum": 5}})),
]

assert len(SCHEMAS) >= 50
