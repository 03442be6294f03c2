"""What the engine hands back: one `RequestOutput` per request per step it advanced."""

from __future__ import annotations

from dataclasses import dataclass

from refengine.step_messages import SampledToken

TokenLogprob = SampledToken


@dataclass(frozen=True)
class CompletionOutput:
    """One sample (of `n`) of a request, cumulative so far."""

    index: int
    token_ids: tuple[int, ...]
    new_token_ids: tuple[int, ...]  # added since this request's previous output
    finish_reason: str | None = None  # "length", "stop", "aborted"
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per output token, when requested

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    outputs: tuple[CompletionOutput, ...]

    @property
    def finished(self) -> bool:
        return all(output.finished for output in self.outputs)
