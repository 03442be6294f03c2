"""Retries with exponential backoff, for connection failures only.

A request Triton answered (even with an error) is never retried: only `ServerUnavailableError`
(connection refused, gRPC UNAVAILABLE before any response) is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from clients.errors import ClientError, ServerUnavailableError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """`retries` more attempts after the first, waiting `backoff_s`, then × `multiplier`, up to `max_backoff_s`."""

    retries: int = 2
    backoff_s: float = 0.25
    multiplier: float = 2.0
    max_backoff_s: float = 4.0

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if self.backoff_s < 0 or self.multiplier < 1 or self.max_backoff_s < 0:
            raise ValueError("backoff_s and max_backoff_s must be >= 0 and multiplier >= 1")

    @property
    def max_attempts(self) -> int:
        return self.retries + 1

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1-based)."""
        return min(self.backoff_s * self.multiplier ** (retry - 1), self.max_backoff_s)

    @staticmethod
    def is_retryable(error: BaseException) -> bool:
        return isinstance(error, ServerUnavailableError)

    def call(self, attempt: Callable[[], T], *, sleep: Callable[[float], None] = time.sleep) -> T:
        """`attempt()` until it succeeds, raises a non-retryable error, or the retries run out."""
        for number in range(1, self.max_attempts + 1):
            try:
                return attempt()
            except ClientError as error:
                if not self.is_retryable(error):
                    raise
                if number == self.max_attempts:
                    raise error.with_attempts(number) from error  # type: ignore[attr-defined]
            sleep(self.delay(number))
        raise AssertionError("unreachable")  # pragma: no cover

    async def acall(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """The asyncio form of `call`."""
        for number in range(1, self.max_attempts + 1):
            try:
                return await attempt()
            except ClientError as error:
                if not self.is_retryable(error):
                    raise
                if number == self.max_attempts:
                    raise error.with_attempts(number) from error  # type: ignore[attr-defined]
            await asyncio.sleep(self.delay(number))
        raise AssertionError("unreachable")  # pragma: no cover
