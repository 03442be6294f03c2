"""A completion's `prompt`: a string, a list of strings, a list of token ids, or a list of token-id
lists. Token ids are checked here for type and sign; the vocabulary and context limits in planning."""

from __future__ import annotations

from typing import Any

from pydantic.config import JsonDict, JsonValue

_TOKEN_IDS_SCHEMA: JsonDict = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
PROMPT_SCHEMAS: list[JsonValue] = [
    {"type": "string"},
    {"type": "array", "items": {"type": "string"}, "minItems": 1},
    _TOKEN_IDS_SCHEMA,
    {"type": "array", "items": _TOKEN_IDS_SCHEMA, "minItems": 1},
]


def checked_prompt(value: Any) -> Any:
    """`value` as a prompt, or ValueError saying what is wrong (and where)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise ValueError("prompt must be a string, a list of strings, or token ids, and not empty")
    if all(isinstance(item, str) for item in value):
        return value
    if all(_is_token_id(item) for item in value):
        return _token_ids(value, "prompt")
    if all(isinstance(item, list) for item in value):
        return [_token_ids(item, f"prompt[{position}]") for position, item in enumerate(value)]
    raise ValueError("prompt mixes strings, token ids and lists; send one kind")


def prompt_list(prompt: Any) -> list[str | list[int]]:
    """Each prompt of a checked `prompt`: text, or token ids."""
    if isinstance(prompt, str) or (prompt and _is_token_id(prompt[0])):
        return [prompt]
    return list(prompt)


def _is_token_id(value: Any) -> bool:
    """An integer, or a number written with a fraction that equals one (`2.0`, as JSON Schema has it)."""
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)


def _token_ids(values: list[Any], where: str) -> list[int]:
    if not values:
        raise ValueError(f"{where} is an empty token list")
    ids = []
    for position, token_id in enumerate(values):
        if not _is_token_id(token_id):
            raise ValueError(f"{where}[{position}] is not a token id (an integer), got {token_id!r:.40}")
        if token_id < 0:
            raise ValueError(f"{where}[{position}]: token id {int(token_id)} is negative")
        ids.append(int(token_id))
    return ids
