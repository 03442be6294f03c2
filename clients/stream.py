"""One request's responses as an iterator of text deltas, with retries, cancellation and timing.

A transport opens a *call* (one request on the wire) whose `chunks()` yields `Chunk`s and ends
after the final one. `TextStream` / `AsyncTextStream` drive it: they retry opening the call
while the server is unreachable and nothing was received yet, cancel it when the caller stops
early (`break` + garbage collection, `close()`, `cancel()` from any thread, the context manager),
and assemble the `Completion` once the final response arrived.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Iterator
from typing import Any, Protocol

from clients.errors import ClientError
from clients.record import Recorder, beam_texts, delta_text
from clients.retry import RetryPolicy
from clients.types import Chunk, Completion


class Call(Protocol):
    def chunks(self) -> Iterator[Chunk]: ...
    def cancel(self) -> None: ...  # thread-safe, idempotent; stops the request where the protocol can
    def close(self) -> None: ...  # release after the final response (or an error); idempotent


class AsyncCall(Protocol):
    def chunks(self) -> AsyncIterator[Chunk]: ...
    def cancel(self) -> None: ...
    def close(self) -> None: ...


class _Cancelled(Exception):
    pass


class _StreamState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.call: Call | AsyncCall | None = None
        self.cancelled = False
        self.finished = False

    def attach(self, call: Call | AsyncCall) -> None:
        with self.lock:
            if not self.cancelled:
                self.call = call
                return
        call.cancel()
        raise _Cancelled

    def cancel(self) -> None:
        with self.lock:
            if self.finished or self.cancelled:
                return
            self.cancelled = True
            call = self.call
        if call is not None:
            call.cancel()


class TextStream(Iterator[str]):
    """The text deltas of one request. `completion` is set once the final response arrived."""

    _whole_beams = False

    def __init__(self, open_call: Callable[[], Call], policy: RetryPolicy, *, protocol: str, max_tokens: int | None) -> None:
        self._state = _StreamState()
        self._record = Recorder(protocol, max_tokens, self._whole_beams)
        # The generator must not reference this object: a dropped stream is then freed (and its
        # call cancelled) at once by reference counting, not by a later garbage collection.
        self._deltas = _deltas(open_call, policy, self._state, self._record, beam_texts if self._whole_beams else delta_text)

    @property
    def completion(self) -> Completion | None:
        return self._record.completion

    @property
    def cancelled(self) -> bool:
        return self._state.cancelled

    @property
    def log_probs_received(self) -> tuple[float, ...]:
        """Per-token log-probs of the responses so far (empty unless the request asked for log-probs)."""
        return tuple(self._record.log_probs)

    def __next__(self) -> str:
        delta: str = next(self._deltas)
        return delta

    def cancel(self) -> None:
        """Stop the request (server-side over gRPC); safe from any thread. Iteration then ends."""
        self._state.cancel()

    def close(self) -> None:
        self.cancel()
        try:
            self._deltas.close()
        except ValueError:  # being iterated in another thread; cancel() already stops it
            pass

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer (e.g. at interpreter exit)
            pass


class AsyncTextStream(AsyncIterator[str]):
    """The asyncio form of TextStream (`async for`, `async with`, `aclose()`, `cancel()`)."""

    _whole_beams = False

    def __init__(self, open_call: Callable[[], Awaitable[AsyncCall]], policy: RetryPolicy, *, protocol: str, max_tokens: int | None) -> None:
        self._state = _StreamState()
        self._record = Recorder(protocol, max_tokens, self._whole_beams)
        item = beam_texts if self._whole_beams else delta_text
        self._deltas = _async_deltas(open_call, policy, self._state, self._record, item)  # no reference to self

    @property
    def completion(self) -> Completion | None:
        return self._record.completion

    @property
    def cancelled(self) -> bool:
        return self._state.cancelled

    @property
    def tokens_received(self) -> int | None:
        """Tokens in the responses so far; None unless the request asked for log-probs."""
        return self._record.tokens if self._record.responses else 0

    @property
    def log_probs_received(self) -> tuple[float, ...]:
        """Per-token log-probs of the responses so far (empty unless the request asked for log-probs)."""
        return tuple(self._record.log_probs)

    async def __anext__(self) -> str:
        delta: str = await self._deltas.__anext__()
        return delta

    def cancel(self) -> None:
        self._state.cancel()

    async def aclose(self) -> None:
        self.cancel()
        try:
            await self._deltas.aclose()
        except RuntimeError:  # being iterated by another task; cancel() already stops it
            pass

    async def __aenter__(self) -> AsyncTextStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        self.cancel()  # synchronous: a gRPC call's cancel() and closing an HTTP response need no loop


class BeamStream(TextStream):
    """A streamed beam-search request: each item is every returned beam's text so far, whole and best first (a beam
    may continue another from one step to the next, so each item replaces the last); `completion.beams` at the end."""

    _whole_beams = True

    def __next__(self) -> tuple[str, ...]:  # type: ignore[override]
        beams: tuple[str, ...] = next(self._deltas)
        return beams


class AsyncBeamStream(AsyncTextStream):
    """The asyncio form of BeamStream."""

    _whole_beams = True

    async def __anext__(self) -> tuple[str, ...]:  # type: ignore[override]
        beams: tuple[str, ...] = await self._deltas.__anext__()
        return beams


def _deltas(
    open_call: Callable[[], Call], policy: RetryPolicy, state: _StreamState, record: Recorder, item: Callable[[Chunk], Any]
) -> Generator[Any, None, None]:
    def open_first() -> tuple[Call, Iterator[Chunk], Chunk | None]:
        call = open_call()
        state.attach(call)
        chunks = call.chunks()
        try:
            return call, chunks, next(chunks, None)
        except BaseException:
            call.close()
            raise

    try:
        call, chunks, first = policy.call(open_first)
    except _Cancelled:
        return
    except ClientError:
        if state.cancelled:
            return
        raise
    try:
        for chunk in itertools.chain([first] if first is not None else [], chunks):
            record.add(chunk)
            if value := item(chunk):
                yield value
        _finish(state, record)
    except ClientError:
        if not state.cancelled:
            raise
    finally:
        call.close() if state.finished else call.cancel()


async def _async_deltas(
    open_call: Callable[[], Awaitable[AsyncCall]], policy: RetryPolicy, state: _StreamState, record: Recorder, item: Callable[[Chunk], Any]
) -> AsyncGenerator[Any, None]:
    async def open_first() -> tuple[AsyncCall, AsyncIterator[Chunk], Chunk | None]:
        call = await open_call()
        state.attach(call)
        chunks = call.chunks()
        try:
            return call, chunks, await anext(chunks, None)
        except BaseException:
            call.close()
            raise

    try:
        call, chunks, first = await policy.acall(open_first)
    except _Cancelled:
        return
    except ClientError:
        if state.cancelled:
            return
        raise
    try:
        if first is not None:
            record.add(first)
            if value := item(first):
                yield value
            async for chunk in chunks:
                record.add(chunk)
                if value := item(chunk):
                    yield value
        _finish(state, record)
    except ClientError:
        if not state.cancelled:
            raise
    finally:
        call.close() if state.finished else call.cancel()


def _finish(state: _StreamState, record: Recorder) -> None:
    with state.lock:
        state.finished = not state.cancelled
    if state.finished:
        record.finish()
