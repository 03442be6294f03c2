"""Synthetic, seeded workloads for the engine benchmark.

- `make_workload`: long-tailed serving traffic. Prompts of random token ids with lengths uniform in
  `prompt_len` (inclusive), output lengths geometric with mean `output_mean` (support 1, 2, …),
  capped at `output_cap`. Every request is meant to run exactly its output length (no end id).
- `make_prefix_workload`: one shared system prompt prepended to every request's own suffix, and
  the waves in which the requests are submitted (the first wave is one request, which computes
  the shared prefix; later waves can reuse it).

Both are pure functions of their arguments (`random.Random(seed)`), so every system in one
benchmark run, and every run with the same seed, sees the same requests.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Any

# Token ids 0..2 are pad / bos / eos in the default model's tokenizer: random prompts avoid them.
FIRST_TOKEN_ID = 3


@dataclass(frozen=True)
class Workload:
    prompts: tuple[tuple[int, ...], ...]
    output_lens: tuple[int, ...]
    seed: int
    prompt_len: tuple[int, int]
    output_mean: float
    output_cap: int

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    def summary(self) -> dict[str, Any]:
        prompt_lens = [len(p) for p in self.prompts]
        outputs = sorted(self.output_lens)
        return {
            "num_requests": self.num_requests,
            "seed": self.seed,
            "prompt_len_range": list(self.prompt_len),
            "output_len_distribution": f"geometric(mean={self.output_mean:g}), capped at {self.output_cap}",
            "prompt_tokens": {"total": sum(prompt_lens), "mean": round(statistics.fmean(prompt_lens), 1), "min": min(prompt_lens), "max": max(prompt_lens)},
            "output_tokens": {
                "total": sum(outputs),
                "mean": round(statistics.fmean(outputs), 1),
                "min": outputs[0],
                "p50": outputs[len(outputs) // 2],
                "p90": outputs[min(len(outputs) - 1, (9 * len(outputs)) // 10)],
                "max": outputs[-1],
            },
        }


@dataclass(frozen=True)
class PrefixWorkload:
    shared_prefix: tuple[int, ...]
    prompts: tuple[tuple[int, ...], ...]  # shared_prefix + own suffix
    output_len: int
    waves: tuple[tuple[int, ...], ...]  # request indices, submitted wave after wave

    @property
    def num_requests(self) -> int:
        return len(self.prompts)


def geometric_length(rng: random.Random, mean: float, cap: int) -> int:
    """A draw from the geometric distribution on {1, 2, …} with the given mean, capped at `cap`."""
    if mean < 1:
        raise ValueError(f"output mean must be >= 1, got {mean}")
    if mean == 1:
        return 1
    p = 1.0 / mean
    u = rng.random()  # [0, 1): 1 - u in (0, 1]
    return min(cap, 1 + int(math.log(1.0 - u) / math.log(1.0 - p)))


def random_tokens(rng: random.Random, length: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(length))


def make_workload(
    num_requests: int,
    *,
    vocab_size: int,
    prompt_len: tuple[int, int] = (16, 256),
    output_mean: float = 64,
    output_cap: int = 512,
    seed: int = 0,
) -> Workload:
    low, high = prompt_len
    if not 1 <= low <= high:
        raise ValueError(f"prompt_len must be (low, high) with 1 <= low <= high, got {prompt_len}")
    if num_requests < 1 or output_cap < 1:
        raise ValueError("num_requests and output_cap must be >= 1")
    rng = random.Random(seed)
    prompts, output_lens = [], []
    for _ in range(num_requests):
        prompts.append(random_tokens(rng, rng.randint(low, high), vocab_size))
        output_lens.append(geometric_length(rng, output_mean, output_cap))
    return Workload(tuple(prompts), tuple(output_lens), seed, (low, high), float(output_mean), output_cap)


def make_prefix_workload(
    num_requests: int,
    *,
    vocab_size: int,
    shared_prefix_len: int = 200,
    suffix_len: tuple[int, int] = (16, 64),
    output_len: int = 16,
    wave_size: int = 8,
    seed: int = 0,
) -> PrefixWorkload:
    """`num_requests` prompts sharing their first `shared_prefix_len` tokens, in waves of one
    request (it computes the prefix), then `wave_size` requests each."""
    rng = random.Random(f"prefix-{seed}")
    prefix = random_tokens(rng, shared_prefix_len, vocab_size)
    prompts = tuple(prefix + random_tokens(rng, rng.randint(*suffix_len), vocab_size) for _ in range(num_requests))
    waves = [(0,)] + [tuple(range(i, min(i + wave_size, num_requests))) for i in range(1, num_requests, wave_size)]
    return PrefixWorkload(prefix, prompts, output_len, tuple(w for w in waves if w))
