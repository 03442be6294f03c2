"""Choice events and results → OpenAI response bodies, stream chunks and server-sent events.

A stream is `data: <chunk JSON>` events ending with `data: [DONE]`. Chat streams open each choice
with a chunk whose delta is `{"role": "assistant", "content": ""}`; the last chunk of a choice has
its `finish_reason` (and an empty delta). With `stream_options.include_usage`, every chunk has
`"usage": null` and one more chunk, with no choices, carries the usage before `[DONE]`. An error
after the stream has started is sent as one `data: {"error": …}` event, then `[DONE]`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, cast

from clients.openai_server.generation import ChoiceEvent, ChoiceResult
from clients.openai_server.logprobs import TokenLogprob
from clients.openai_server.planning import Plan
from clients.openai_server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatLogprobs,
    ChatTokenLogprob,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    Usage,
)

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


def usage(plan: Plan, completion_tokens: int) -> Usage:
    return Usage(prompt_tokens=plan.prompt_tokens, completion_tokens=completion_tokens, total_tokens=plan.prompt_tokens + completion_tokens)


def completion_logprobs(items: Sequence[TokenLogprob], *, offset: int = 0, prompt: Sequence[TokenLogprob] = ()) -> CompletionLogprobs:
    """`prompt`: the echoed prompt's tokens (offsets from 0), before the generated ones (from `offset`)."""
    placed = [(item, item.offset) for item in prompt] + [(item, offset + item.offset) for item in items]
    return CompletionLogprobs(
        tokens=[item.token for item, _ in placed],
        token_logprobs=[item.logprob for item, _ in placed],
        top_logprobs=[_top_dict(item) for item, _ in placed],
        text_offset=[position for _, position in placed],
    )


def _top_dict(item: TokenLogprob) -> dict[str, float] | None:
    """The alternatives by token text (the most likely of tokens that read the same wins), or the token alone."""
    if item.logprob is None:
        return None
    if not item.top:
        return {item.token: item.logprob}
    top: dict[str, float] = {}
    for token, logprob in item.top:
        top.setdefault(token, logprob)
    return top


def chat_logprobs(items: Iterable[TokenLogprob]) -> ChatLogprobs:
    return ChatLogprobs(
        content=[
            ChatTokenLogprob(
                token=item.token,
                logprob=cast(float, item.logprob),  # a generated token's is never None (only a prompt's first token has none)
                bytes=list(item.token.encode("utf-8")),
                top_logprobs=[{"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))} for token, logprob in item.top],
            )
            for item in items
        ]
    )


class Answer:
    """One request's identity (id, creation time, model name) and its bodies."""

    def __init__(self, plan: Plan, model: str, *, chat: bool) -> None:
        self.plan = plan
        self.model = model
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._opened: set[int] = set()
        self._tokens: dict[int, int] = {}

    # -- whole answers -------------------------------------------------------------------------
    def body(self, results: Sequence[ChoiceResult]) -> dict[str, Any]:
        total = usage(self.plan, sum(result.completion_tokens for result in results))
        if self.chat:
            choices = [
                ChatChoice(
                    index=result.index,
                    message=AssistantMessage(content=result.text),
                    logprobs=chat_logprobs(result.logprobs) if self.plan.logprobs else None,
                    finish_reason=result.finish_reason,
                )
                for result in results
            ]
            return ChatCompletion(id=self.id, created=self.created, model=self.model, choices=choices, usage=total).model_dump(mode="json")
        completion_choices = []
        for result in results:
            echo = self.plan.echo[result.index] if self.plan.echo else ""
            logprobs = completion_logprobs(result.logprobs, offset=len(echo), prompt=result.prompt_logprobs) if self.plan.logprobs else None
            completion_choices.append(CompletionChoice(index=result.index, text=echo + result.text, logprobs=logprobs, finish_reason=result.finish_reason))
        return Completion(id=self.id, created=self.created, model=self.model, choices=completion_choices, usage=total).model_dump(mode="json")

    # -- streams --------------------------------------------------------------------------------
    def chunks(self, event: ChoiceEvent) -> list[bytes]:
        """The events one choice event becomes (a chat choice's first also opens it)."""
        self._tokens[event.index] = event.completion_tokens
        out = []
        first = event.index not in self._opened
        self._opened.add(event.index)
        if self.chat:
            if first:
                out.append(self._chunk({"index": event.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}))
            if event.text or event.logprobs:
                logprobs = chat_logprobs(event.logprobs).model_dump(mode="json") if self.plan.logprobs else None
                out.append(self._chunk({"index": event.index, "delta": {"content": event.text}, "logprobs": logprobs, "finish_reason": None}))
            if event.finish_reason is not None:
                out.append(self._chunk({"index": event.index, "delta": {}, "logprobs": None, "finish_reason": event.finish_reason}))
            return out
        if event.text or event.logprobs or event.finish_reason is not None:  # (echo is never streamed: planning)
            logprobs = completion_logprobs(event.logprobs).model_dump(mode="json") if self.plan.logprobs else None
            out.append(self._chunk({"index": event.index, "text": event.text, "logprobs": logprobs, "finish_reason": event.finish_reason}))
        return out

    def closing(self) -> list[bytes]:
        """The usage chunk (if asked for) and [DONE]."""
        out = []
        if self.plan.include_usage:
            total = usage(self.plan, sum(self._tokens.values()))
            out.append(sse({**self._envelope(), "choices": [], "usage": total.model_dump(mode="json")}))
        out.append(DONE)
        return out

    def _envelope(self) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _chunk(self, choice: dict[str, Any]) -> bytes:
        payload = {**self._envelope(), "choices": [choice]}
        if self.chat:
            payload["system_fingerprint"] = None
        if self.plan.include_usage:
            payload["usage"] = None
        return sse(payload)
