"""The GPU-pace stand-in's pure part: its rate, what a request asks of it, the tokens it emits and when.

numpy only, importable outside Triton (tests); `model.py` is the Triton glue. The stand-in computes nothing:
a request's output is `max_tokens` tokens taken from a fixed cycle of token ids (text the bench encoded with
the repository's tokenizer, `standin_tokens.json`), starting at a place that depends on the prompt, so every
prompt has its own text and any client can know it in advance. The end id never occurs in the cycle, so a
request always runs its full length.

Pace: with a rate of R tokens/s per request, token i (0-based) of a request is due 1/R·(i+1) seconds after the
request arrived, as a GPU's decoding steps produce them; with `max` every token is due at once and the only
limit is how fast the server takes the responses. Streamed, the responses follow TensorRT-LLM's stream_interval
N (as the cpu engine): the first token alone, then every N tokens, and the rest with the last one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MAX_RATE = "max"
CONTEXT_TOKENS = 8  # preceding_ids per response, as the cpu model's (incremental_detokenizer.CONTEXT_TOKENS)
LOG_PROB = -0.5  # every emitted token's log-probability: no distribution is computed
_REFUSED_FLAGS = {
    "return_context_logits": "computes no logits",
    "return_generation_logits": "computes no logits",
    "return_perf_metrics": "has no engine to time",
}


class StandinError(ValueError):
    """A request the stand-in refuses; the message names the input (answered with INVALID_ARG)."""


def parse_rate(text: str) -> float | None:
    """The `standin_tokens_per_s` parameter: tokens per second per request (> 0, finite), or `max` (None)."""
    value = text.strip().lower()
    if value == MAX_RATE:
        return None
    try:
        rate = float(value)
    except ValueError:
        raise ValueError(f"standin_tokens_per_s: {text!r} is neither a number of tokens/s per request nor {MAX_RATE!r}") from None
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"standin_tokens_per_s: {text!r} must be more than 0 tokens/s per request (or {MAX_RATE!r})")
    return rate


@dataclass
class Generation:
    """One row of a request: its prompt, the tokens it will get and how they are answered."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    streaming: bool
    exclude_input_in_output: bool
    batch_index: int = 0
    return_log_probs: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    sent: int = 0  # output tokens answered so far (streamed)
    responses: int = 0  # streamed responses sent so far

    @property
    def finished(self) -> bool:
        return self.sent >= len(self.output_ids)


def output_ids(prompt_ids: Sequence[int], max_tokens: int, cycle: Sequence[int]) -> tuple[int, ...]:
    """`max_tokens` tokens from the cycle, starting where the prompt's ids lead (a different text per prompt)."""
    start = sum(prompt_ids) % len(cycle)
    return tuple(cycle[(start + index) % len(cycle)] for index in range(max_tokens))


def parse_rows(arrays: Mapping[str, np.ndarray], *, cycle: Sequence[int], decoupled: bool, exclude_input_default: bool) -> list[Generation] | None:
    """The generations of one Triton request (one per row of input_ids); None for TensorRT-LLM's `stop` request."""
    stop = arrays.get("stop")
    if stop is not None and stop.size and bool(stop.reshape(-1)[0]):
        return None
    input_ids = arrays.get("input_ids")
    if input_ids is None or input_ids.ndim != 2 or input_ids.shape[0] < 1:
        raise StandinError(f"input_ids: expected shape [batch, tokens], got {None if input_ids is None else list(input_ids.shape)}")
    rows = input_ids.shape[0]
    if rows > 1 and not decoupled:
        raise StandinError(f"input_ids: a batch of {rows} prompts needs the model in decoupled mode (one response per prompt)")
    return [_row(arrays, row, rows, cycle, decoupled, exclude_input_default) for row in range(rows)]


def _row(arrays, row: int, rows: int, cycle, decoupled: bool, exclude_input_default: bool) -> Generation:
    def value(name: str, default=None):
        array = arrays.get(name)
        if array is None or array.size == 0:
            if default is None:
                raise StandinError(f"{name}: input is required")
            return default
        flat = array.reshape(array.shape[0], -1)
        if flat.shape[0] not in (1, rows) or flat.shape[1] != 1:
            raise StandinError(f"{name}: expected one value per row of input_ids, got shape {list(array.shape)}")
        return flat[row if flat.shape[0] == rows else 0, 0].item()

    for name in ("beam_width", "num_return_sequences"):
        if int(value(name, 1)) > 1:
            raise StandinError(f"{name}: the GPU-pace stand-in generates one sequence per request, got {int(value(name, 1))}")
    for name, why in _REFUSED_FLAGS.items():
        if bool(value(name, False)):
            raise StandinError(f"{name}: the GPU-pace stand-in {why}")
    length = int(value("input_lengths"))
    ids = arrays["input_ids"][row]
    if not 1 <= length <= ids.shape[0]:
        raise StandinError(f"input_lengths: {length} must be between 1 and the {ids.shape[0]} tokens of input_ids")
    max_tokens = int(value("request_output_len"))
    if max_tokens < 1:
        raise StandinError(f"request_output_len: must be at least 1, got {max_tokens}")
    streaming = bool(value("streaming", False))
    if streaming and not decoupled:
        raise StandinError("streaming: streaming is only supported if the model is deployed in decoupled mode")
    prompt = tuple(int(token) for token in ids[:length])
    return Generation(
        prompt_ids=prompt,
        output_ids=output_ids(prompt, max_tokens, cycle),
        streaming=streaming,
        exclude_input_in_output=bool(value("exclude_input_in_output", exclude_input_default)),
        batch_index=row,
        return_log_probs=bool(value("return_log_probs", False)),
        return_num_input_tokens=bool(value("return_num_input_tokens", False)),
        return_num_output_tokens=bool(value("return_num_output_tokens", False)),
    )


def next_chunk(generation: Generation, stream_interval: int) -> int:
    """How many tokens the next response of a generation carries: everything when not streamed; streamed, the
    first token alone, then `stream_interval` tokens, and whatever is left with the last."""
    left = len(generation.output_ids) - generation.sent
    if not generation.streaming:
        return left
    return 1 if generation.responses == 0 else min(stream_interval, left)


def due_after(tokens_done: int, rate: float | None) -> float:
    """Seconds after arrival when the response completing `tokens_done` tokens is due (0 at `max`)."""
    return 0.0 if rate is None else tokens_done / rate


def response_arrays(generation: Generation, count: int) -> dict[str, np.ndarray]:
    """The arrays of the response that answers the next `count` tokens (streamed) or the whole output (final),
    shaped as the cpu model's (llm_response.py): output_ids [1, 1, T], the rest [1, 1] or [1, 1, K]."""
    start = generation.sent
    new = list(generation.output_ids[start : start + count])
    if generation.streaming:
        ids, context = new, (list(generation.prompt_ids) + list(generation.output_ids[:start]))[-CONTEXT_TOKENS:]
    elif generation.exclude_input_in_output:
        ids, context = new, list(generation.prompt_ids)[-CONTEXT_TOKENS:]
    else:
        ids, context = list(generation.prompt_ids) + new, []
    arrays = {
        "output_ids": np.array(ids, dtype=np.int32).reshape(1, 1, -1),
        "sequence_length": np.array([[len(ids)]], dtype=np.int32),
        "batch_index": np.array([[generation.batch_index]], dtype=np.int32),
        "sequence_index": np.array([[0]], dtype=np.int32),
        "preceding_ids": np.array(context, dtype=np.int32).reshape(1, 1, -1),
    }
    if generation.return_log_probs:
        arrays["cum_log_probs"] = np.array([[LOG_PROB * (start + len(new))]], dtype=np.float32)
        arrays["output_log_probs"] = np.full((1, 1, len(new)), LOG_PROB, dtype=np.float32)
    if generation.return_num_input_tokens:
        arrays["num_input_tokens"] = np.array([[len(generation.prompt_ids)]], dtype=np.int32)
    if generation.return_num_output_tokens:
        arrays["num_output_tokens"] = np.array([[start + len(new)]], dtype=np.int32)
    return arrays
