"""What the capacity bench measures (`CapacityOptions`), checked before anything is built or started."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.errors import SpecError

DEFAULT_CONCURRENCY = (8, 32, 64, 128)
DEFAULT_STREAM_INTERVALS = (1, 4)
DEFAULT_RATE = "100"
PROMPT = "def capacity(tokens_per_s, instances):"


@dataclasses.dataclass(frozen=True)
class CapacityOptions:
    """Per stream interval, `rounds` rounds run every path in turn (the order rotates), each path's round in a server of
    its own through every concurrency point (streams in flight): `warmup_s` unmeasured, then a `window_s` window.
    `rate` is the stand-in's tokens/s per request (a number, or `max`); `max_tokens` each request's length."""

    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    stream_intervals: tuple[int, ...] = DEFAULT_STREAM_INTERVALS
    rate: str = DEFAULT_RATE
    max_tokens: int = 64
    rounds: int = 2
    warmup_s: float = 1.0
    window_s: float = 4.0
    nvidia_models: Path | None = None
    paths: tuple[str, ...] = ()  # the paths to run (repository.bench_paths' names); empty: all
    prompt: str = PROMPT
    stall_s: float = 20.0
    startup_timeout_s: float = 180.0

    def offered_tokens_per_s(self, concurrency: int) -> float | None:
        """What the stand-in offers at `concurrency` streams (None at `max`: as much as the server takes)."""
        return None if self.rate == "max" else concurrency * float(self.rate)


def checked_options(options: CapacityOptions) -> CapacityOptions:
    """The options, or SpecError naming the flag: a rate of 0 or less, no or unknown points or paths, bad sizes."""
    rate = options.rate.strip().lower()
    if rate != "max":
        try:
            value = float(rate)
        except ValueError:
            raise SpecError(f"--rate {options.rate!r}: expected tokens/s per request (a number > 0) or 'max'") from None
        if not value > 0 or value == float("inf"):
            raise SpecError(f"--rate {options.rate}: the stand-in's rate must be more than 0 tokens/s per request (or 'max')")
    if not options.concurrency or min(options.concurrency) < 1:
        raise SpecError(f"--concurrency {list(options.concurrency)}: every point must be at least 1 stream")
    if not options.stream_intervals or min(options.stream_intervals) < 1:
        raise SpecError(f"--stream-intervals {list(options.stream_intervals)}: every interval must be at least 1")
    known = ("ensemble", "ensemble_batched", "bls", "floor", "floor_batched", "nvidia")
    unknown = [name for name in options.paths if name not in known]
    if unknown:
        raise SpecError(f"--paths {','.join(unknown)}: unknown; the paths are {', '.join(known)}")
    if "nvidia" in options.paths and options.nvidia_models is None:
        raise SpecError("--paths nvidia needs --nvidia-models DIR (TensorRT-LLM's triton_backend/all_models/inflight_batcher_llm)")
    if options.max_tokens < 2 or options.rounds < 1 or options.window_s <= 0 or options.warmup_s < 0:
        raise SpecError("--tokens must be at least 2, --rounds at least 1 and --window more than 0 seconds")
    return dataclasses.replace(options, rate=rate)


def check_queue(options: CapacityOptions, max_queue_size: int) -> None:
    """SpecError for a concurrency the server's queues would refuse: Triton answers the requests over serve.max_queue_size
    with an error, and in Triton 2.51 an ensemble request refused by one of its steps never ends (core #466): a hang."""
    if max_queue_size and max(options.concurrency) > max_queue_size:
        raise SpecError(
            f"--concurrency {max(options.concurrency)} exceeds serve.max_queue_size {max_queue_size}: Triton would refuse the "
            "requests over it, and in Triton 2.51 an ensemble request refused by one of its steps never ends (core #466)",
            hint=f"lower --concurrency to at most {max_queue_size}, or raise serve.max_queue_size (--set serve.max_queue_size=N, 0 = unbounded)",
        )


def integer_list(text: str, flag: str) -> tuple[int, ...]:
    """`8,32,64` → (8, 32, 64); SpecError naming `flag` otherwise."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise SpecError(f"{flag} {text!r}: expected comma-separated integers, e.g. 8,32,64,128") from None
    if not values:
        raise SpecError(f"{flag} {text!r}: expected at least one value")
    return values
