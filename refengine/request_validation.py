"""Checks a request against the engine before it is queued.

Each refusal is an `InvalidRequestError` naming the field and the value, raised before any
engine state changes, so the engine keeps serving the other requests.
"""

from __future__ import annotations

from typing import Any

from refengine.config import BatchingMode, EngineConfig, SchedulerPolicy
from refengine.errors import InvalidRequestError
from refengine.sampling import SamplingParams


def validate_prompt(prompt_token_ids: Any, vocab_size: int) -> tuple[int, ...]:
    if isinstance(prompt_token_ids, (str, bytes)):
        raise InvalidRequestError("prompt_token_ids", "must be a list of token ids, got a string")
    try:
        prompt = tuple(prompt_token_ids)
    except TypeError:
        raise InvalidRequestError("prompt_token_ids", f"must be a list of token ids, got {type(prompt_token_ids).__name__}") from None
    if not prompt:
        raise InvalidRequestError("prompt_token_ids", "is empty; a request needs at least one prompt token")
    for index, token_id in enumerate(prompt):
        if isinstance(token_id, bool) or not isinstance(token_id, int):
            raise InvalidRequestError("prompt_token_ids", f"item {index} ({token_id!r}) is not an integer")
        if not 0 <= token_id < vocab_size:
            raise InvalidRequestError(
                "prompt_token_ids",
                f"token id {token_id} at index {index} is outside the vocabulary [0, {vocab_size})",
            )
    return prompt


def validate_request(prompt_token_ids: Any, params: SamplingParams, config: EngineConfig, vocab_size: int, model_limit: int | None = None) -> tuple[int, ...]:
    """The prompt as a tuple, if the request can be served; raises `InvalidRequestError` otherwise.

    `model_limit`: the most tokens (prompt + max_tokens) the model computes exactly, where it has such a limit
    (the model's `max_request_tokens`: Gemma 2 without its window in the checkpoint, refengine/gemma_options.py)."""
    if not isinstance(params, SamplingParams):
        raise InvalidRequestError("sampling_params", f"must be SamplingParams, got {type(params).__name__}")
    prompt = validate_prompt(prompt_token_ids, vocab_size)
    prompt_len = len(prompt)
    if prompt_len > config.max_input_len:
        raise InvalidRequestError(
            "prompt_token_ids",
            f"prompt length {prompt_len} exceeds max_input_len {config.max_input_len}",
        )
    for field, token_id in params.token_ids_to_check():
        if token_id >= vocab_size:
            raise InvalidRequestError(field, f"token id {token_id} is outside the vocabulary [0, {vocab_size})")
    if prompt_len + params.max_tokens > config.max_seq_len:
        raise InvalidRequestError(
            "max_tokens",
            f"prompt length {prompt_len} + max_tokens {params.max_tokens} = {prompt_len + params.max_tokens} exceeds max_seq_len {config.max_seq_len}",
        )
    if model_limit is not None and prompt_len + params.max_tokens > model_limit:
        raise InvalidRequestError(
            "max_tokens",
            f"prompt length {prompt_len} + max_tokens {params.max_tokens} = {prompt_len + params.max_tokens} exceeds "
            f"{model_limit} tokens, this model's window limit (its local layers' sliding window, which the checkpoint "
            "does not give: longer sequences would need it)",
        )
    if params.beam_width > config.max_beam_width:
        raise InvalidRequestError("beam_width", f"{params.beam_width} exceeds the engine's max_beam_width {config.max_beam_width}")
    if params.beam_width > 1 and config.batching is BatchingMode.STATIC:
        raise InvalidRequestError("beam_width", f"{params.beam_width}: beam search runs with inflight batching only, not static")
    if params.beam_width > config.max_batch_size:
        raise InvalidRequestError("beam_width", f"{params.beam_width} exceeds max_batch_size {config.max_batch_size}")
    if params.beam_width == 1 and params.n > config.max_num_samples:  # with beams n <= beam_width
        raise InvalidRequestError("n", f"{params.n} exceeds the engine's max_num_samples {config.max_num_samples}")
    if params.n > config.max_batch_size:
        raise InvalidRequestError("n", f"{params.n} exceeds max_batch_size {config.max_batch_size}")
    if params.logprobs is not None and params.logprobs > config.max_logprobs:
        raise InvalidRequestError("logprobs", f"{params.logprobs} exceeds the engine's max_logprobs {config.max_logprobs}")
    if not config.enable_chunked_context and prompt_len > config.max_num_tokens:
        raise InvalidRequestError(
            "prompt_token_ids",
            f"prompt length {prompt_len} exceeds max_num_tokens {config.max_num_tokens} and enable_chunked_context is off",
        )
    _check_draft_tokens(params, config)
    _check_fits_cache(prompt_len, params, config)
    return prompt


def _check_draft_tokens(params: SamplingParams, config: EngineConfig) -> None:
    """`num_draft_tokens` (TensorRT-LLM's per-request draft length): 0 turns speculation off,
    up to the build's max_draft_len; None is the engine's default (max_draft_len, or off)."""
    requested = params.num_draft_tokens
    if requested is None or requested == 0:
        return
    if config.max_draft_len == 0:
        raise InvalidRequestError(
            "num_draft_tokens",
            f"{requested} draft tokens requested, but the engine was built without speculative decoding (max_draft_len 0)",
        )
    if requested > config.max_draft_len:
        raise InvalidRequestError("num_draft_tokens", f"{requested} exceeds the engine's max_draft_len {config.max_draft_len}")


def _check_fits_cache(prompt_len: int, params: SamplingParams, config: EngineConfig) -> None:
    """Refuse what could never be admitted, even with the whole KV cache to itself."""
    block_size, total = config.tokens_per_block, config.total_kv_blocks
    needed = -(-(prompt_len + params.max_tokens) // block_size)
    if needed > total:
        raise InvalidRequestError(
            "max_tokens",
            f"prompt length {prompt_len} + max_tokens {params.max_tokens} needs {needed} KV-cache blocks "
            f"of {block_size} tokens, but the cache has only {total}",
        )
    if params.beam_width > 1 and params.beam_width * needed > total:
        raise InvalidRequestError(
            "beam_width",
            f"{params.beam_width} beams of up to {prompt_len + params.max_tokens} tokens need "
            f"{params.beam_width * needed} KV-cache blocks (beams are never preempted), but the cache has only {total}",
        )
    if config.scheduler_policy is SchedulerPolicy.GUARANTEED_NO_EVICT and params.n * needed > total:
        raise InvalidRequestError(
            "n",
            f"{params.n} samples of up to {prompt_len + params.max_tokens} tokens need {params.n * needed} "
            f"KV-cache blocks under guaranteed_no_evict, but the cache has only {total}",
        )
