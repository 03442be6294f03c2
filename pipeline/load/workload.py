"""Workloads for the load benchmark and the performance gate: synthetic prompts with given input
and output token-length distributions, or prompts from a file.

Synthetic prompts are windows of real text (the bundled held-out corpus, or any text file) cut
at a sampled token length and decoded, so they tokenize back to (almost exactly) that length;
each request's `input_tokens` is the re-encoded count. Seeded: the same arguments give the same
requests.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from clients.load import LoadRequest
from pipeline.calibration import load_tokenizer
from pipeline.errors import SpecError

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "data" / "heldout" / "stdlib_heldout.txt"


@dataclass(frozen=True)
class LengthDist:
    """Token lengths drawn from a normal distribution, rounded and clipped to [1, cap]."""

    mean: int
    stddev: float = 0.0

    def __post_init__(self) -> None:
        if self.mean < 1:
            raise ValueError(f"a token length mean must be >= 1, got {self.mean}")
        if self.stddev < 0:
            raise ValueError(f"a token length stddev must be >= 0, got {self.stddev}")

    def sample(self, rng: random.Random, cap: int) -> int:
        value = self.mean if self.stddev == 0 else round(rng.gauss(self.mean, self.stddev))
        return max(1, min(cap, value))

    def describe(self) -> str:
        return f"{self.mean}" if self.stddev == 0 else f"{self.mean}±{self.stddev:g}"


class TextTokenizer:
    """A model directory's tokenizer: encode (no special tokens) and decode."""

    def __init__(self, tokenizer_dir: Path) -> None:
        try:
            self._tokenizer = load_tokenizer(tokenizer_dir)
        except (OSError, ValueError) as error:
            raise SpecError(f"synthetic prompts need the model's tokenizer; none loads from {tokenizer_dir}: {error}") from None

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)


def synthetic_requests(
    tokenizer: TextTokenizer,
    count: int,
    *,
    input_tokens: LengthDist,
    output_tokens: LengthDist,
    max_input_len: int,
    max_output_len: int,
    corpus: Path = DEFAULT_CORPUS,
    seed: int = 0,
) -> list[LoadRequest]:
    if count < 1:
        raise ValueError(f"the workload needs >= 1 request, got {count}")
    stream = tokenizer.encode(corpus.read_text(encoding="utf-8", errors="replace"))
    if len(stream) < 2:
        raise SpecError(f"the prompt corpus {corpus} has no text")
    rng = random.Random(f"load-{seed}")
    requests = []
    for _ in range(count):
        length = input_tokens.sample(rng, min(max_input_len, len(stream) - 1))
        start = rng.randrange(0, len(stream) - length)
        prompt = tokenizer.decode(stream[start : start + length])
        requests.append(LoadRequest(prompt, output_tokens.sample(rng, max_output_len), input_tokens=len(tokenizer.encode(prompt))))
    return requests


def file_requests(
    path: Path, *, output_tokens: LengthDist, max_output_len: int, encode: Callable[[str], list[int]] | None = None, seed: int = 0
) -> list[LoadRequest]:
    """Prompts from `path`: JSON lines ({"prompt": str, "max_tokens": int (optional)}) for .jsonl,
    otherwise one prompt per non-empty line. Missing max_tokens are drawn from `output_tokens`."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise SpecError(f"--prompts {path}: cannot read it: {error}") from None
    rng = random.Random(f"load-{seed}")
    requests = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        prompt, max_tokens = line, None
        if path.suffix == ".jsonl":
            prompt, max_tokens = _json_prompt(path, number, line)
        if max_tokens is None:
            max_tokens = output_tokens.sample(rng, max_output_len)
        requests.append(LoadRequest(prompt, max_tokens, input_tokens=len(encode(prompt)) if encode else None))
    if not requests:
        raise SpecError(f"--prompts {path}: no prompts in it")
    return requests


def _json_prompt(path: Path, number: int, line: str) -> tuple[str, int | None]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise SpecError(f"{path}:{number}: not a JSON line ({error.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
        raise SpecError(f'{path}:{number}: expected an object with a "prompt" string')
    max_tokens = record.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise SpecError(f"{path}:{number}: max_tokens must be a positive integer, got {max_tokens!r}")
    return record["prompt"], max_tokens
