"""Running the choices of one OpenAI request as Triton requests (gRPC streaming, `AsyncTritonLLMClient`).

Every choice is one streamed request to the ensemble, whether or not the OpenAI client asked to
stream: responses arrive token by token, so a client that goes away cancels its request on the
server at once (Triton does not pass the cancellation of a non-streamed ensemble request to the
LLM model), and every response carries its token's log-probability (`return_log_probs`), from
which `completion_tokens` is counted exactly as the engine generated them. `n` choices run as `n`
concurrent requests; their events are interleaved as they come (`merged`).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping, Sequence

from clients.aio import AsyncTritonLLMClient
from clients.errors import ServerUnavailableError
from clients.openai_server.stops import StopMatcher
from clients.stream import AsyncTextStream
from clients.types import GenerationRequest


@dataclass(frozen=True)
class ChoicePlan:
    """One Triton request: `sampling` holds the other GenerationRequest fields (temperature, seed, …)."""

    index: int
    prompt: str
    max_tokens: int
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    sampling: Mapping[str, Any] = field(default_factory=dict)

    def request(self) -> GenerationRequest:
        return GenerationRequest(self.prompt, self.max_tokens, stop=list(self.stop) or None, return_log_probs=True, **self.sampling)


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: the text it completed (empty for a token that completes no character
    yet, e.g. the first byte of a multi-byte character), its log-probability, and where that text
    starts in the choice's text."""

    token: str
    logprob: float
    offset: int


@dataclass(frozen=True)
class ChoiceEvent:
    """New text of choice `index`; the last event of a choice has its `finish_reason`."""

    index: int
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: str | None = None
    completion_tokens: int = 0


class _Logprobs:
    """Per-token log-probs, released in step with the text they belong to."""

    def __init__(self) -> None:
        self._pending: list[TokenLogprob] = []
        self._text_length = 0

    def add(self, text: str, values: Sequence[float]) -> None:
        """The tokens behind one text delta; the text belongs to the last of them."""
        for position, value in enumerate(values):
            token = text if position == len(values) - 1 else ""
            self._pending.append(TokenLogprob(token, float(value), self._text_length))
        self._text_length += len(text)

    def release(self, upto: int | None) -> tuple[TokenLogprob, ...]:
        """Tokens whose text starts before `upto` characters (all of them for None)."""
        count = len(self._pending) if upto is None else sum(1 for item in self._pending if item.offset < upto)
        released, self._pending = tuple(self._pending[:count]), self._pending[count:]
        return released

    def drop(self) -> None:
        self._pending.clear()


class OpenStreams:
    """The Triton requests of one OpenAI request, cancellable synchronously (from a finally block of a
    task being cancelled, where nothing can be awaited) when its client goes away."""

    def __init__(self) -> None:
        self._streams: list[AsyncTextStream] = []

    def add(self, stream: AsyncTextStream) -> AsyncTextStream:
        self._streams.append(stream)
        return stream

    def cancel(self) -> None:
        for stream in self._streams:
            stream.cancel()  # a no-op for a finished one


async def run_choice(client: AsyncTritonLLMClient, plan: ChoicePlan, streams: OpenStreams | None = None) -> AsyncIterator[ChoiceEvent]:
    """The events of one choice; raises the `clients` error Triton's answer maps to."""
    stream = client.stream_request(plan.request())
    if streams is not None:
        streams.add(stream)
    matcher = StopMatcher(plan.stop)
    logprobs = _Logprobs()
    seen = 0

    def account(delta: str) -> int:
        nonlocal seen
        tokens = stream.tokens_received or 0
        if plan.logprobs and tokens > seen:
            logprobs.add(delta, stream.log_probs_received[seen:tokens])
        seen = max(seen, tokens)
        return seen

    try:
        async for delta in stream:
            tokens = account(delta)
            text, stopped = matcher.push(delta)
            if stopped:
                stream.cancel()  # the engine may still be generating past the stop sequence
                released = logprobs.release(matcher.released)
                yield ChoiceEvent(plan.index, text, released, "stop", tokens)
                return
            released = logprobs.release(matcher.released)
            if text or released:
                yield ChoiceEvent(plan.index, text, released, None, tokens)
        if stream.cancelled:  # not by us: the server is stopping (or the client went away, and nobody reads this)
            raise ServerUnavailableError(client.url, "the request was cancelled: the server is stopping")
        tokens = account("")  # a last response that completed no text
        text = matcher.flush()
        finish = "length" if tokens >= plan.max_tokens else "stop"
        yield ChoiceEvent(plan.index, text, logprobs.release(None), finish, tokens)
    finally:
        stream.cancel()  # synchronous (safe while being cancelled); a no-op once finished


_DONE = object()


async def merged(client: AsyncTritonLLMClient, plans: Sequence[ChoicePlan], streams: OpenStreams | None = None) -> AsyncIterator[ChoiceEvent]:
    """The events of every choice, interleaved in arrival order. The first error ends everything:
    the other requests are cancelled (also when the consumer stops iterating)."""
    if len(plans) == 1:
        async with contextlib.aclosing(run_choice(client, plans[0], streams)) as events:
            async for event in events:
                yield event
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(plan: ChoicePlan) -> None:
        try:
            async with contextlib.aclosing(run_choice(client, plan, streams)) as events:
                async for event in events:
                    queue.put_nowait(event)
            queue.put_nowait(_DONE)
        except Exception as error:  # noqa: BLE001 - handed to the consumer, who raises it
            queue.put_nowait(error)

    tasks = [asyncio.ensure_future(pump(plan)) for plan in plans]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()  # each run_choice cancels its Triton request on the way out


@dataclass
class ChoiceResult:
    """A whole choice, for a non-streamed answer."""

    index: int
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0


async def collect(events: AsyncIterator[ChoiceEvent], count: int) -> list[ChoiceResult]:
    """Every choice's whole text, in index order."""
    results = [ChoiceResult(index) for index in range(count)]
    texts: list[list[str]] = [[] for _ in range(count)]
    async for event in events:
        result = results[event.index]
        texts[event.index].append(event.text)
        result.logprobs.extend(event.logprobs)
        result.completion_tokens = event.completion_tokens
        if event.finish_reason is not None:
            result.finish_reason = event.finish_reason
    for result, parts in zip(results, texts):
        result.text = "".join(parts)
    return results
