"""What the load generator sends (`LoadRequest`) and what it measures per request (`RequestRecord`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LoadRequest:
    """One prompt of the workload. `exact_output` asks the server for exactly `max_tokens` tokens
    (min_tokens = max_tokens), so output lengths follow the workload rather than the model."""

    prompt: str
    max_tokens: int
    input_tokens: int | None = None
    exact_output: bool = True


@dataclass
class RequestRecord:
    """Timings of one request, in seconds on the monotonic clock.

    `token_times[i]` is when the response carrying the i-th output token arrived (a response
    covering k tokens gives k equal entries). Time to first token is the first entry minus
    `start`; inter-token latency is the mean gap after the first token, as GenAI-Perf defines
    it: (last - first) / (tokens - 1). Where the server does not say how many tokens a response
    carries (OpenAI streaming), each response with text counts as one token when it arrives and
    `output_tokens` is then set from the final `usage`.
    """

    start: float
    input_tokens: int | None = None
    end: float | None = None
    token_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    error: str | None = None

    def add_tokens(self, count: int, at: float) -> None:
        self.token_times.extend([at] * count)
        self.output_tokens += count

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None and self.output_tokens > 0

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def e2e_s(self) -> float | None:
        return None if self.end is None else self.end - self.start

    @property
    def itl_s(self) -> float | None:
        if self.output_tokens < 2 or not self.token_times:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (self.output_tokens - 1)
