"""Request bodies: read within the size limit, checked against the nesting limit, parsed into a schema.

Every refusal is an `OpenAIError`: a body over `max_body_bytes` is 413 (`request_too_large`); a
body that is not UTF-8, not JSON or not a JSON object is 400 (`invalid_json`); a body that nests
deeper than `max_json_depth` is 400 (`json_too_deep`); a value the schema refuses is 400 naming
the field. The nesting limit is checked on the raw bytes before anything recursive runs
(`json.loads` and pydantic's parser both recurse per level, and ~100 KB of `[[[…` would end in a
RecursionError): each `[` or `{` outside a string opens a level, so `{"a": [1]}` nests 2 deep.
The scan is linear and runs at C speed for ordinary bodies (a few ms for 1 MiB of text; ~50 ms
for a 1 MiB body made of brackets only).
"""

from __future__ import annotations

import json
from itertools import accumulate
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from clients.openai_server import errors

DRAIN_LIMIT_BYTES = 64 << 20  # a refused body is read (and dropped) up to this size, so the client sees the 413
M = TypeVar("M", bound=BaseModel)

_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")
_AS_SQUARE = bytes.maketrans(b"{}", b"[]")  # valid JSON pairs them properly; only the levels matter here
_STEP = [0] * 256
_STEP[ord("[")], _STEP[ord("]")] = 1, -1
_CHUNK = 1 << 14


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or 413 if it is (or says it is) longer than `limit` bytes."""
    declared = request.headers.get("content-length", "")
    too_large = declared.isdigit() and int(declared) > limit
    parts: list[bytes] = []
    size = 0
    try:
        async for part in request.stream():
            size += len(part)
            if size > limit:
                too_large = True
            if too_large:
                if size > DRAIN_LIMIT_BYTES:
                    break
                continue
            parts.append(part)
    except ClientDisconnect:  # gone before its body arrived: nobody reads an answer; no traceback in the log
        raise errors.OpenAIError(499, "the client disconnected before its request body arrived", code="client_disconnected") from None
    if too_large:
        raise errors.body_too_large(limit)
    return b"".join(parts)


def parse(schema: type[M], body: bytes, *, max_depth: int) -> M:
    """`body` as `schema`, or the 400 that says why not."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise errors.bad_request(f"We could not parse the JSON body of your request: it is not UTF-8 ({error})", code="invalid_json") from None
    if nests_deeper_than(body, max_depth):
        raise errors.json_too_deep(max_depth)
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as error:
        raise errors.bad_request(f"We could not parse the JSON body of your request: {error}", code="invalid_json") from None
    if not isinstance(payload, dict):
        raise errors.bad_request(f"The request body must be a JSON object, not {type(payload).__name__}.", code="invalid_json")
    try:
        return schema.model_validate_json(body)
    except ValidationError as error:
        raise errors.from_validation_error(error) from None


def nests_deeper_than(body: bytes, limit: int) -> bool:
    """Whether the JSON text `body` (UTF-8) opens more than `limit` arrays/objects inside each other.

    Strings are cut out first (escaped backslashes and quotes removed, then every other piece
    between quotes dropped), so brackets in text do not count; an unterminated string hides what
    follows it, as a parser stops there too. Malformed input is never refused as "too deep"
    unless a parser would have to recurse that deep before finding the error.
    """
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = b"".join(unescaped.split(b'"')[::2]).translate(_AS_SQUARE, _NOT_BRACKETS)
    if brackets.count(b"[") <= limit:
        return False
    # Dropping the empty pairs (every innermost container, once the content is gone) lowers the
    # peak by at most one level, and shrinks wide bodies (`[[1],[2],…]`) to almost nothing.
    reduced = brackets.replace(b"[]", b"")
    if _peak_exceeds(reduced, limit):
        return True
    if not _peak_exceeds(reduced, limit - 1):
        return False
    return _peak_exceeds(brackets, limit)


def _peak_exceeds(brackets: bytes, limit: int) -> bool:
    """Whether the running level of `[` (+1) and `]` (-1) goes above `limit`; stops as soon as it does."""
    level = 0
    for start in range(0, len(brackets), _CHUNK):
        levels = list(accumulate(map(_STEP.__getitem__, brackets[start : start + _CHUNK]), initial=level))
        if max(levels) > limit:
            return True
        level = levels[-1]
    return False
