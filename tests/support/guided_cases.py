"""Guided-decoding cases shared by the serving tests: schemas of our own and prompts the default tiny
model (which writes Python, not JSON) continues."""

from __future__ import annotations

import json

import jsonschema

SCHEMAS = {
    "person": {  # nested object, enum, integer range, string pattern, required and optional keys
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z]{1,10}$"},
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "role": {"enum": ["admin", "user", "guest"]},
            "address": {
                "type": "object",
                "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "city": {"type": "string", "maxLength": 12}},
                "required": ["zip"],
            },
            "nickname": {"type": "string", "maxLength": 8},
        },
        "required": ["name", "age", "role", "address"],
    },
    "measurements": {  # an array of objects with number ranges, bounded length
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"value": {"type": "number", "minimum": -10, "maximum": 10}, "ok": {"type": "boolean"}},
            "required": ["value", "ok"],
        },
        "minItems": 1,
        "maxItems": 3,
    },
}
PROMPTS = ["def parse(config):\n    return", "# the user record as JSON:\n"]
MAX_TOKENS = 160


def validated(text: str, schema: dict) -> object:
    """The parsed answer; raises when it is not JSON or does not validate."""
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value
