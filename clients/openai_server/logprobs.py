"""Per-token log-probabilities of a choice, as the OpenAI bodies carry them (`TokenLogprob`), and
their release in step with the text a stop-sequence matcher lets out (`PendingLogprobs`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True)
class TokenLogprob:
    """One token: its text (on the ensemble path, the text it completed: empty for a token that
    completes no character yet, e.g. the first byte of a multi-byte character; on the LLM path, the
    token on its own), its log-probability (None for a prompt's first token, which nothing
    predicts), where its text starts in the choice's text, and the most likely tokens at its
    position (token text, log-probability), most likely first, when asked for."""

    token: str
    logprob: float | None
    offset: int
    top: tuple[tuple[str, float], ...] = ()


class PendingLogprobs:
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

    def add_token(self, token: str, logprob: float, top: tuple[tuple[str, float], ...], text: str) -> None:
        """One token whose `text` (possibly empty) follows the text so far."""
        self._pending.append(TokenLogprob(token, logprob, self._text_length, top))
        self._text_length += len(text)

    def release(self, upto: int | None) -> tuple[TokenLogprob, ...]:
        """Tokens whose text starts before `upto` characters (all of them for None)."""
        count = len(self._pending) if upto is None else sum(1 for item in self._pending if item.offset < upto)
        released, self._pending = tuple(self._pending[:count]), self._pending[count:]
        return released


def log_softmax(logits: NDArray[Any]) -> NDArray[Any]:
    """Log-probabilities of logits rows (last axis), in float64."""
    values = np.asarray(logits, dtype=np.float64)
    shifted = values - values.max(axis=-1, keepdims=True)
    logprobs: NDArray[Any] = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return logprobs


def top_ids(logprobs: NDArray[Any], count: int) -> list[tuple[int, float]]:
    """The `count` most likely (token id, log-probability) of one row, most likely first."""
    if count <= 0:
        return []
    count = min(count, logprobs.shape[-1])
    ids = np.argpartition(-logprobs, count - 1)[:count]
    ids = ids[np.argsort(-logprobs[ids], kind="stable")]
    return [(int(token_id), _finite(logprobs[token_id])) for token_id in ids]


def _finite(value: float) -> float:
    """JSON has no -inf: a banned token's log-probability is reported as the lowest float."""
    value = float(value)
    return value if math.isfinite(value) else -3.4028234663852886e38
