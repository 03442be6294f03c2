"""Running the choices of one OpenAI request as Triton requests (gRPC streaming, `AsyncTritonLLMClient`).

Every choice is one streamed request to the ensemble, whether or not the OpenAI client asked to
stream: responses arrive token by token, so a client that goes away ends its request on the
server at once (Triton does not pass the cancellation of a non-streamed ensemble request to the
LLM model; on an ensemble the request is ended by a `stop` to the LLM model, not cancelled:
clients/aio_stop.py), and every response carries its token's log-probability (`return_log_probs`), from
which `completion_tokens` is counted exactly as the engine generated them. `n` choices run as `n`
concurrent requests; their events are interleaved as they come (`merged`). Choices that need
token ids or logits go to the LLM model directly instead (`ChoicePlan.direct`, llm_path.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from clients.aio import AsyncTritonLLMClient
from clients.errors import RequestError, ServerUnavailableError
from clients.lora import NOT_CACHED, LoraAdapter
from clients.openai_server.llm_path import llm_pieces
from clients.openai_server.logprobs import PendingLogprobs, TokenLogprob
from clients.openai_server.schemas import FinishReason
from clients.openai_server.stops import StopMatcher
from clients.openai_server.tokenizer import PromptTokenizer
from clients.stream import AsyncTextStream
from clients.types import GenerationRequest


@dataclass(frozen=True)
class ChoicePlan:
    """One Triton request: `sampling` holds the other GenerationRequest fields (temperature, seed, …).

    With `prompt_ids`, the choice goes to the LLM model directly (llm_path.py): token-id prompts,
    `top_logprobs` alternatives per token, the prompt's log-probs (`prompt_logprobs`), `logit_bias`
    and `max_tokens` 0 need it; `prompt` is then the prompt's text as echoed.
    """

    index: int
    prompt: str
    max_tokens: int
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    sampling: Mapping[str, Any] = field(default_factory=dict)
    prompt_ids: tuple[int, ...] = ()
    top_logprobs: int = 0
    prompt_logprobs: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias): TensorRT-LLM's embedding_bias
    lora: LoraAdapter | None = None  # the LoRA adapter the request's `model` names

    @property
    def direct(self) -> bool:
        return bool(self.prompt_ids)

    def request(self) -> GenerationRequest:
        return GenerationRequest(self.prompt, self.max_tokens, stop=list(self.stop) or None, return_log_probs=True, lora=self.lora, **self.sampling)


@dataclass(frozen=True)
class ChoiceEvent:
    """New text of choice `index`; the last event of a choice has its `finish_reason`. The first
    event of a choice that asked for prompt log-probs carries them (`prompt_logprobs`)."""

    index: int
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: FinishReason | None = None
    completion_tokens: int = 0
    prompt_logprobs: tuple[TokenLogprob, ...] = ()


class Cancellable(Protocol):
    def cancel(self) -> None: ...  # synchronous


_CancellableT = TypeVar("_CancellableT", bound=Cancellable)


class OpenStreams:
    """The Triton requests of one OpenAI request, cancellable synchronously (from a finally block of a
    task being cancelled, where nothing can be awaited) when its client goes away: ensemble streams
    (`AsyncTextStream`) and direct calls of the LLM model (`AioGrpcCall`, llm_path.py)."""

    def __init__(self) -> None:
        self._streams: list[Cancellable] = []

    def add(self, stream: _CancellableT) -> _CancellableT:
        self._streams.append(stream)
        return stream

    def cancel(self) -> None:
        for stream in self._streams:
            stream.cancel()  # a no-op for a finished one


@dataclass(frozen=True)
class Route:
    """Where choices go: the ensemble (or BLS) through `client`; direct choices to `llm_model`, with
    the served model's `tokenizer` doing the pre- and postprocessing."""

    client: AsyncTritonLLMClient
    tokenizer: PromptTokenizer | None = None
    llm_model: str = "tensorrt_llm"


async def run_choice(route: Route, plan: ChoicePlan, streams: OpenStreams | None = None) -> AsyncGenerator[ChoiceEvent, None]:
    """The events of one choice; raises the `clients` error Triton's answer maps to. A LoRA adapter's id alone that
    Triton has not cached (evicted, or Triton restarted) is sent once more, with the adapter's weights."""
    for retry in (False, True):
        started = False
        try:
            async with contextlib.aclosing(_choice_events(route, plan, streams)) as events:
                async for event in events:
                    started = True
                    yield event
            return
        except RequestError as error:
            if started or retry or plan.lora is None or NOT_CACHED not in error.message:
                raise
            route.client.sent_adapters.forget(plan.lora)


async def _choice_events(route: Route, plan: ChoicePlan, streams: OpenStreams | None) -> AsyncGenerator[ChoiceEvent, None]:
    logprobs = PendingLogprobs()
    prompt: list[tuple[TokenLogprob, ...]] = []
    if plan.direct:
        if route.tokenizer is None:
            raise ValueError("a direct choice needs the served model's tokenizer")
        pieces = llm_pieces(route.client, plan, route.tokenizer, route.llm_model, logprobs, lambda call: _opened(call, streams), prompt.append)
    else:
        pieces = _ensemble_pieces(route.client, _opened(route.client.stream_request(plan.request()), streams), plan, logprobs)
    matcher = StopMatcher(plan.stop)
    tokens = 0
    async with contextlib.aclosing(pieces):
        async for delta, tokens in pieces:
            text, stopped = matcher.push(delta)
            released = logprobs.release(matcher.released)
            opening = prompt.pop() if prompt else ()
            if stopped:
                yield ChoiceEvent(plan.index, text, released, "stop", tokens, opening)
                return  # closing `pieces` ends the request (cancel, or stop on an ensemble): the engine may still be generating past the stop
            if text or released or opening:
                yield ChoiceEvent(plan.index, text, released, None, tokens, opening)
    text = matcher.flush()
    finish: FinishReason = "length" if tokens >= plan.max_tokens else "stop"
    yield ChoiceEvent(plan.index, text, logprobs.release(None), finish, tokens, prompt.pop() if prompt else ())


def _opened(stream: _CancellableT, streams: OpenStreams | None) -> _CancellableT:
    if streams is not None:
        streams.add(stream)
    return stream


async def _ensemble_pieces(
    client: AsyncTritonLLMClient, stream: AsyncTextStream, plan: ChoicePlan, logprobs: PendingLogprobs
) -> AsyncGenerator[tuple[str, int], None]:
    """(text delta, tokens so far) of an ensemble request; the tokens' log-probs go to `logprobs`."""
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
            yield delta, account(delta)
        if stream.cancelled:  # not by us: the server is stopping (or the client went away, and nobody reads this)
            raise ServerUnavailableError(client.url, "the request was cancelled: the server is stopping")
        counted = seen
        if account("") > counted:  # a last response that completed no text
            yield "", seen
    finally:
        stream.cancel()  # synchronous (safe while being cancelled); a no-op once finished


_DONE = object()


async def merged(route: Route, plans: Sequence[ChoicePlan], streams: OpenStreams | None = None) -> AsyncGenerator[ChoiceEvent, None]:
    """The events of every choice, interleaved in arrival order. The first error ends everything:
    the other requests are cancelled (also when the consumer stops iterating)."""
    if len(plans) == 1:
        async with contextlib.aclosing(run_choice(route, plans[0], streams)) as events:
            async for event in events:
                yield event
        return
    queue: asyncio.Queue[Any] = asyncio.Queue()  # events, then _DONE or an exception, of each choice

    async def pump(plan: ChoicePlan) -> None:
        try:
            async with contextlib.aclosing(run_choice(route, plan, streams)) as events:
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
    finish_reason: FinishReason | None = None
    completion_tokens: int = 0
    prompt_logprobs: tuple[TokenLogprob, ...] = ()


async def collect(events: AsyncIterator[ChoiceEvent], count: int) -> list[ChoiceResult]:
    """Every choice's whole text, in index order."""
    results = [ChoiceResult(index) for index in range(count)]
    texts: list[list[str]] = [[] for _ in range(count)]
    async for event in events:
        result = results[event.index]
        texts[event.index].append(event.text)
        result.logprobs.extend(event.logprobs)
        result.completion_tokens = event.completion_tokens
        result.prompt_logprobs = result.prompt_logprobs or event.prompt_logprobs
        if event.finish_reason is not None:
            result.finish_reason = event.finish_reason
    for result, parts in zip(results, texts):
        result.text = "".join(parts)
    return results
