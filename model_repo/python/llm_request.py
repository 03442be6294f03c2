"""The `tensorrt_llm` tensor contract → a refengine request, with TensorRT-LLM's semantics.

Pure (numpy + refengine), so it is testable outside Triton. Arrays carry Triton's batch axis; a
request of batch B is split into B generations (`split_rows`), as TensorRT-LLM's backend makes one
executor request per row, and each row's responses carry its `batch_index`.

Semantics kept from TensorRT-LLM:
- `runtime_top_k` 0 and `runtime_top_p` 0 (the defaults) mean greedy decoding; `runtime_top_p`
  0 with `runtime_top_k` > 0 is top-k only.
- `input_lengths` says how many leading entries of `input_ids` are the prompt (the rest is padding).
- `stop` true cancels the in-flight requests that carry the same Triton request id.
- `exclude_input_in_output` (request input, else the model parameter) drops the prompt from
  non-streamed `output_ids`; streamed responses never contain the prompt.
- Streamed beam search: each response carries every returned beam whole, not the step's new tokens.
- `priority` (the cpu model's input): in [0, 1], higher is scheduled first; absent, 0.5 (TensorRT-LLM's default).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from word_lists import WordListError, from_word_list

from refengine import InvalidRequestError, LoraRequest, SamplingParams
from refengine.guided.params import GuidedDecodingParams, guided_params
from refengine.priority import DEFAULT_PRIORITY, check_priority
from refengine.sampling import check_temperature

# refengine's field names → the contract's input names, for error messages clients can act on.
CONTRACT_NAMES = {
    "max_tokens": "request_output_len",
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "stop_token_ids": "stop_words_list",
    "bad_words": "bad_words_list",
    "n": "num_return_sequences",
    "prompt_token_ids": "input_ids",
    "logprobs": "return_log_probs",
    "logit_bias": "embedding_bias",
    "length_penalty": "len_penalty",
}

# Inputs this engine cannot honour at all: a request that carries one is refused, by name.
_UNSUPPORTED_PRESENT = {
    "lookahead_window_size": "lookahead decoding is not done by the cpu reference engine",
    "lookahead_ngram_size": "lookahead decoding is not done by the cpu reference engine",
    "lookahead_verification_set_size": "lookahead decoding is not done by the cpu reference engine",
}
# Accepted and ignored: the engine is decoder-only, and the ensemble always sends NVIDIA's placeholder
# (one pad id), as TensorRT-LLM's backend ignores it. Every other input the contract declares is read
# by `parse_request` (honoured or refused by name; tests/pipeline/render/test_contract.py checks it).
IGNORED_INPUTS = ("decoder_input_ids", "decoder_input_lengths")


class ContractError(ValueError):
    """A request that does not fit the contract or the engine; the message names the input."""


@dataclass(frozen=True)
class GenerateRequest:
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    streaming: bool
    exclude_input_in_output: bool
    return_log_probs: bool
    return_perf_metrics: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    batch_index: int = 0  # the row of a batched Triton request this generation answers
    lora: LoraRequest | None = None  # lora_task_id (+ lora_weights / lora_config): checked by the engine's LoRA cache
    priority: float = DEFAULT_PRIORITY  # in [0, 1], higher first


@dataclass(frozen=True)
class StopRequest:
    """TensorRT-LLM's cancellation request: `stop` true, matched by Triton request id."""


def contract_error(error: InvalidRequestError) -> ContractError:
    name = CONTRACT_NAMES.get(error.field, error.field)
    message = str(error)
    if message.startswith(f"{error.field}:"):
        message = message[len(error.field) + 1 :].strip()
    return ContractError(f"{name}: {message}")


def parse_request(
    arrays: Mapping[str, np.ndarray],
    *,
    exclude_input_default: bool,
    decoupled: bool,
) -> GenerateRequest | StopRequest:
    """Read one request's input arrays (name → array with a leading batch axis of 1)."""
    scalars = _Scalars(arrays)
    if scalars.get("stop", bool, False):
        return StopRequest()
    prompt = _prompt(arrays, scalars)
    streaming = scalars.get("streaming", bool, False)
    if streaming and not decoupled:
        raise ContractError("streaming: streaming is only supported if the model is deployed in decoupled mode")
    beam_width = scalars.get("beam_width", int, 1)
    for name, reason in _UNSUPPORTED_PRESENT.items():
        if name in arrays:
            raise ContractError(f"{name}: {reason}")
    length_penalty = scalars.get("len_penalty", float, 1.0)
    if not math.isfinite(length_penalty):
        raise ContractError(f"len_penalty: must be a finite number, got {length_penalty}")
    # len_penalty and early_stopping shape beam search only; at beam_width 1 they change nothing.
    early_stopping = scalars.get("early_stopping", bool, False)
    # Beam search returns its best num_return_sequences beams (all beam_width by default, as
    # TensorRT-LLM's SamplingConfig) together in one response: output_ids [1, beams, T]; streamed,
    # one such response per step with every beam whole (TensorRT-LLM's LlmRequest sets
    # returnAllGeneratedTokens for streamed beams: a beam may continue another from step to step).
    num_sequences = scalars.get("num_return_sequences", int, beam_width if beam_width > 1 else 1)
    if num_sequences > 1 and beam_width == 1 and not decoupled:
        raise ContractError("num_return_sequences: more than one sequence needs the model in decoupled mode")
    return_log_probs = scalars.get("return_log_probs", bool, False)
    return_num_output_tokens = scalars.get("return_num_output_tokens", bool, False)
    if return_num_output_tokens and num_sequences > 1 and beam_width == 1:
        raise ContractError(
            f"return_num_output_tokens: not available with num_return_sequences {num_sequences}; each sequence's "
            "responses already carry its tokens (output_ids, sequence_length)"
        )
    top_k = scalars.get("runtime_top_k", int, 0)
    top_p = scalars.get("runtime_top_p", float, 0.0)
    greedy = top_k == 0 and top_p == 0.0
    temperature = scalars.get("temperature", float, 1.0)
    try:
        priority = check_priority(scalars.get("priority", float, DEFAULT_PRIORITY))
        check_temperature(temperature)  # also when greedy decoding ignores it, as TensorRT-LLM checks it
        params = SamplingParams(
            max_tokens=scalars.get("request_output_len", int),
            temperature=0.0 if greedy else temperature,
            top_k=top_k,
            top_p=1.0 if top_p == 0.0 else top_p,
            seed=scalars.get("seed", int, None),
            repetition_penalty=scalars.get("repetition_penalty", float, 1.0),
            presence_penalty=scalars.get("presence_penalty", float, 0.0),
            frequency_penalty=scalars.get("frequency_penalty", float, 0.0),
            min_tokens=scalars.get("min_tokens", int, 0),
            end_id=scalars.get("end_id", int, None),
            pad_id=scalars.get("pad_id", int, None),
            stop_token_ids=_words(arrays, "stop_words_list"),
            bad_words=_words(arrays, "bad_words_list"),
            logit_bias=_bias(arrays),
            n=num_sequences,
            logprobs=0 if return_log_probs else None,
            return_context_logits=scalars.get("return_context_logits", bool, False),
            return_generation_logits=scalars.get("return_generation_logits", bool, False),
            num_draft_tokens=scalars.get("num_draft_tokens", int, None),
            use_draft_logits=scalars.get("use_draft_logits", bool, None),
            guided_decoding=_guide(arrays),
            beam_width=beam_width,
            length_penalty=length_penalty if beam_width > 1 else 1.0,
            early_stopping=early_stopping if beam_width > 1 else False,
        )
    except InvalidRequestError as error:
        raise contract_error(error) from None
    return GenerateRequest(
        prompt_ids=prompt,
        params=params,
        streaming=streaming,
        exclude_input_in_output=scalars.get("exclude_input_in_output", bool, exclude_input_default),
        return_log_probs=return_log_probs,
        return_perf_metrics=scalars.get("return_perf_metrics", bool, False),
        return_num_input_tokens=scalars.get("return_num_input_tokens", bool, False),
        return_num_output_tokens=return_num_output_tokens,
        lora=_lora(arrays, scalars),
        priority=priority,
    )


def split_rows(arrays: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """A request of batch B → B requests of batch 1 (as TensorRT-LLM's backend splits them).
    Inputs with one row apply to every row."""
    input_ids = arrays.get("input_ids")
    batch = int(input_ids.shape[0]) if input_ids is not None and input_ids.ndim >= 1 else 1
    rows: list[dict[str, np.ndarray]] = [{} for _ in range(batch)]
    for name, array in arrays.items():
        if array.ndim == 0 or array.shape[0] not in (1, batch):
            raise ContractError(f"{name}: expected a leading batch axis of 1 or {batch} (input_ids), got shape {list(array.shape)}")
        for index, row in enumerate(rows):
            row[name] = array[index : index + 1] if array.shape[0] == batch else array
    return rows


def parse_batch(arrays: Mapping[str, np.ndarray], *, exclude_input_default: bool, decoupled: bool) -> list[GenerateRequest] | StopRequest:
    """`parse_request` for each row of a (possibly batched) request; errors name the row when B > 1."""
    rows = split_rows(arrays)
    parsed = []
    for index, row in enumerate(rows):
        try:
            request = parse_request(row, exclude_input_default=exclude_input_default, decoupled=decoupled)
        except ContractError as error:
            raise ContractError(f"batch row {index}: {error}" if len(rows) > 1 else str(error)) from None
        if isinstance(request, StopRequest):
            return request
        parsed.append(dataclasses.replace(request, batch_index=index))
    return parsed


class _Scalars:
    """Per-request scalar inputs (`[1]` after Triton's reshape, with the batch axis)."""

    _MISSING = object()

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        self._arrays = arrays

    def get(self, name: str, kind: type, default: Any = _MISSING) -> Any:
        array = self._arrays.get(name)
        if array is None:
            if default is self._MISSING:
                raise ContractError(f"{name}: input is required")
            return default
        if array.size != 1:
            raise ContractError(f"{name}: expected one value per request (batch size 1), got shape {list(array.shape)}")
        value = array.reshape(-1)[0].item()
        if kind is bool:
            return bool(value)
        if kind is int:
            return int(value)
        return float(value)


def _lora(arrays: Mapping[str, np.ndarray], scalars: _Scalars) -> LoraRequest | None:
    """lora_task_id, lora_weights [1, rows, values], lora_config [1, rows, 3]: None when none is sent. Their checks
    against the model and the cache are the engine's (TensorRT-LLM's texts, naming the input)."""
    weights, config = arrays.get("lora_weights"), arrays.get("lora_config")
    task_id = scalars.get("lora_task_id", int, None)
    if task_id is None and weights is None and config is None:
        return None
    return LoraRequest(task_id, weights, config)


def _guide(arrays: Mapping[str, np.ndarray]) -> GuidedDecodingParams | None:
    """guided_decoding_guide_type / guided_decoding_guide (STRING [1]); an empty type is no guide (NVIDIA's
    ensemble sends the empty default)."""
    values = {}
    for name in ("guided_decoding_guide_type", "guided_decoding_guide"):
        array = arrays.get(name)
        values[name] = _text(array.reshape(-1)[0]) if array is not None and array.size else ""
    return guided_params(values["guided_decoding_guide_type"], values["guided_decoding_guide"])


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _prompt(arrays: Mapping[str, np.ndarray], scalars: _Scalars) -> tuple[int, ...]:
    input_ids = arrays.get("input_ids")
    if input_ids is None:
        raise ContractError("input_ids: input is required (only a stop request may omit it)")
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ContractError(f"input_ids: expected shape [1, tokens] (batch size 1), got {list(input_ids.shape)}")
    length = scalars.get("input_lengths", int)
    if not 1 <= length <= input_ids.shape[1]:
        raise ContractError(f"input_lengths: {length} must be between 1 and the {input_ids.shape[1]} tokens of input_ids")
    return tuple(int(token_id) for token_id in input_ids[0, :length])


def _bias(arrays: Mapping[str, np.ndarray]) -> tuple[tuple[int, float], ...]:
    """`embedding_bias` ([1, vocab] or empty [1, 0]) → its non-zero (token id, bias) pairs."""
    array = arrays.get("embedding_bias")
    if array is None or array.size == 0:
        return ()
    values = array.reshape(-1).astype(np.float64)
    if not np.isfinite(values).all():
        raise ContractError("embedding_bias: must hold finite numbers")
    return tuple((int(index), float(values[index])) for index in np.flatnonzero(values))


def _words(arrays: Mapping[str, np.ndarray], name: str) -> tuple[tuple[int, ...], ...]:
    array = arrays.get(name)
    if array is None:
        return ()
    if array.ndim == 3:
        if array.shape[0] != 1:
            raise ContractError(f"{name}: expected batch size 1, got shape {list(array.shape)}")
        array = array[0]
    try:
        return from_word_list(array, name)
    except WordListError as error:
        raise ContractError(str(error)) from None
