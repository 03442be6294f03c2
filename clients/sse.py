"""Server-sent events, as Triton's `/generate_stream` writes them (`data: {json}` + blank line).

`SSEParser` is incremental: feed it bytes as they arrive (chunk boundaries anywhere, even inside
a UTF-8 character or a CRLF), get complete events back. It follows the WHATWG event-stream rules
that matter here: `\\n`, `\\r\\n` or `\\r` line ends, several `data:` lines joined with `\\n`, one
optional space after the colon, `:` comment lines, `event:` / `id:` fields, other fields ignored.

`openai_events` reads an OpenAI-compatible stream (`data: {chunk}` lines, then `data: [DONE]`).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from clients.errors import ProtocolError, RequestError
from clients.types import Chunk, chunk_from_json


@dataclass(frozen=True)
class SSEEvent:
    data: str
    event: str = "message"
    id: str | None = None


class SSEParser:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self._buffer = ""
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None

    def feed(self, raw: bytes) -> list[SSEEvent]:
        try:
            self._buffer += self._decoder.decode(raw)
        except UnicodeDecodeError as error:
            raise ProtocolError(f"event stream is not UTF-8: {error}") from None
        return self._drain(final=False)

    def close(self) -> list[SSEEvent]:
        """Events still pending at the end of the stream (a last event without its blank line)."""
        try:
            self._buffer += self._decoder.decode(b"", final=True)
        except UnicodeDecodeError as error:
            raise ProtocolError(f"event stream ends inside a UTF-8 character: {error}") from None
        events = self._drain(final=True)
        if self._buffer:
            self._line(self._buffer)
            self._buffer = ""
        event = self._dispatch()
        return events + ([event] if event else [])

    def _drain(self, *, final: bool) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        while True:
            end = _line_end(self._buffer, final=final)
            if end is None:
                return events
            line, self._buffer = self._buffer[: end[0]], self._buffer[end[1] :]
            if line == "":
                event = self._dispatch()
                if event:
                    events.append(event)
            else:
                self._line(line)

    def _line(self, line: str) -> None:
        if line.startswith(":"):
            return
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value

    def _dispatch(self) -> SSEEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return SSEEvent(data="\n".join(data), event=event or "message", id=self._id)


def _line_end(buffer: str, *, final: bool) -> tuple[int, int] | None:
    """(end of the first line, start of the next) or None if no complete line is buffered."""
    for index, char in enumerate(buffer):
        if char == "\n":
            return index, index + 1
        if char == "\r":
            if index + 1 < len(buffer):
                return index, index + (2 if buffer[index + 1] == "\n" else 1)
            # A lone trailing CR may be the first half of CRLF: wait for more, unless the stream ended.
            return (index, index + 1) if final else None
    return None


def chunk_from_event(event: SSEEvent, *, status: int | None = None) -> Chunk:
    """One generate_stream event → a Chunk; Triton's `{"error": ...}` events → RequestError."""
    try:
        payload: Any = json.loads(event.data)
    except json.JSONDecodeError as error:
        raise ProtocolError(f"event data is not JSON ({error}): {event.data[:200]!r}") from None
    if not isinstance(payload, dict):
        raise ProtocolError(f"event data is not a JSON object: {event.data[:200]!r}")
    return chunk_from_json(payload, status=status)


async def openai_events(lines: AsyncIterator[str]) -> AsyncGenerator[dict[str, Any], None]:
    """The JSON events of an OpenAI SSE stream, given its lines (httpx's `aiter_lines()`), up to `data: [DONE]`. An
    error event (`data: {"error": …}`) raises RequestError with its message; a stream ending without `[DONE]`, or
    data that is not JSON, ProtocolError."""
    async for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except json.JSONDecodeError as error:
            raise ProtocolError(f"event data is not JSON ({error}): {data[:200]!r}") from None
        if isinstance(event, dict) and "error" in event:
            detail = event["error"]
            raise RequestError(None, str(detail.get("message", detail)) if isinstance(detail, dict) else str(detail))
        yield event
    raise ProtocolError("the stream ended without [DONE]")


def error_message(body: bytes) -> str:
    """Triton's message from an error body, whether JSON (`generate`) or SSE (`generate_stream`)."""
    text = body.decode("utf-8", errors="replace").strip()
    candidates = [text]
    if text.startswith("data:"):
        parser = SSEParser()
        try:
            candidates = [event.data for event in parser.feed(body) + parser.close()] or candidates
        except ProtocolError:
            pass
    for candidate in candidates:
        try:
            payload = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(payload, dict) and "error" in payload:
            return str(payload["error"])
    return text or "(empty response body)"
