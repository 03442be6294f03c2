"""`SamplingParams`: how one request is decoded. Validated on construction.

Every invalid value raises `InvalidRequestError` whose `field` names the parameter. Checks that
need the engine (vocabulary size, `max_seq_len`, the `n` limit) live in `request_validation`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from refengine.errors import InvalidRequestError
from refengine.guided.params import GUIDE_TYPE_FIELD, GuidedDecodingParams

# TensorRT-LLM's executor only asks temperature >= 0. Past this bound sampling is close to uniform
# for any model (logits 10 apart differ by 10% in probability at 100): a larger value is a typo or
# a fuzzer, refused rather than served as noise.
MAX_TEMPERATURE = 100.0


@dataclass(frozen=True)
class SamplingParams:
    """Decoding options of one request.

    - `temperature` 0 (or `top_k` 1) is greedy; `top_k` 0 and `top_p` 1 disable those filters.
    - `end_id` ends a sequence and is not part of the output (TensorRT-LLM's convention);
      a matched `stop_token_ids` sequence ends it and stays in the output.
    - `repetition_penalty` (multiplicative, as in Hugging Face), `presence_penalty` and
      `frequency_penalty` (additive) apply to every token of the sequence, prompt included.
    - `min_tokens`: `end_id` is masked and stop sequences are ignored until this many tokens.
    - `bad_words`: token sequences that must not be produced (the last token is banned when the
      preceding ones match).
    - `n`: independent samples from one prompt (the prompt's KV blocks are shared); with beams,
      how many of the best beams are returned (TensorRT-LLM's `num_return_sequences`, <= beam_width).
    - `beam_width` > 1: beam search (Hugging Face `generate(num_beams=..., do_sample=False)`);
      `length_penalty` divides a finished beam's log-probability by length ** length_penalty;
      `early_stopping` True / False / "never" as in Hugging Face. Beam search does not sample:
      top_k, top_p and a temperature other than 0 or 1 are refused with it, and so are top logprobs
      (> 0) and generation logits, which it does not implement. A stop sequence ends the beam that
      produces it (kept in its output), as transformers' stopping criteria end a beam candidate.
    - `logprobs`: None for none; k ≥ 0 returns the sampled token's log-probability and the k most
      likely alternatives (from the model's raw distribution).
    - `pad_id`: the contract's padding id; not used in decoding, but like `end_id` it must be a
      token of the vocabulary (TensorRT-LLM's executor refuses others).
    - `logit_bias`: (token id, bias) pairs added to the logits before anything else (TensorRT-LLM's
      `embedding_bias`, OpenAI's `logit_bias`).
    - `return_context_logits`: the model's raw logits at every prompt position, [prompt, vocab]
      (TensorRT-LLM's `context_logits`; row i predicts token i + 1). The prompt is computed in
      full: such a request reuses no cached prefix.
    - `return_generation_logits`: the raw logits each output token was drawn from, [vocab] per
      token (TensorRT-LLM's `generation_logits`).
    - `num_draft_tokens`: speculative decoding's draft length for this request (TensorRT-LLM's
      `num_draft_tokens`): None is the engine's max_draft_len, 0 turns speculation off.
    - `use_draft_logits` (TensorRT-LLM BLS's `use_draft_logits`): how a sampled request accepts a draft
      model's tokens. True: by the draft's distribution q (accept d with probability min(1, p(d)/q(d)));
      False: by comparing tokens (q taken as one-hot(d): accepted with probability p(d), TensorRT-LLM's
      `use_logits False`). Both keep the output distributed as the target's; q accepts at least as often.
      None: the engine's default, q. True needs a draft model (not n-gram drafts) and drafts.
    - `medusa_choices` (Medusa engines): this request's tree of candidates instead of the engine's, TensorRT-LLM's
      syntax as a string ("{0}, {0, 0}, {1}") or a list of paths (empty: the engine's); checked against the heads when
      the request is added.
    - `guided_decoding`: a grammar every output token must follow (refengine.guided); the engine
      must have guided decoding on.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    end_id: int | None = None
    stop_token_ids: tuple[tuple[int, ...], ...] = ()
    bad_words: tuple[tuple[int, ...], ...] = ()
    n: int = 1
    logprobs: int | None = None
    pad_id: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    return_context_logits: bool = False
    return_generation_logits: bool = False
    num_draft_tokens: int | None = None
    use_draft_logits: bool | None = None
    guided_decoding: GuidedDecodingParams | None = None
    beam_width: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    medusa_choices: str | tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, minimum=1)
        check_temperature(self.temperature)
        _check_int("top_k", self.top_k, minimum=0)
        _check_float("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=0)
        _check_float("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise InvalidRequestError("repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        _check_float("presence_penalty", self.presence_penalty)
        _check_float("frequency_penalty", self.frequency_penalty)
        _check_int("min_tokens", self.min_tokens, minimum=0)
        if self.min_tokens > self.max_tokens:
            raise InvalidRequestError("min_tokens", f"{self.min_tokens} exceeds max_tokens {self.max_tokens}")
        for field in ("end_id", "pad_id"):
            if getattr(self, field) is not None:
                _check_int(field, getattr(self, field), minimum=0)
        object.__setattr__(self, "stop_token_ids", _token_sequences("stop_token_ids", self.stop_token_ids))
        object.__setattr__(self, "bad_words", _token_sequences("bad_words", self.bad_words))
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        _check_int("n", self.n, minimum=1)
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, minimum=0)
        if self.num_draft_tokens is not None:
            _check_int("num_draft_tokens", self.num_draft_tokens, minimum=0)
        if self.use_draft_logits is not None and not isinstance(self.use_draft_logits, bool):
            raise InvalidRequestError("use_draft_logits", f"must be true, false or unset, got {self.use_draft_logits!r}")
        for field in ("return_context_logits", "return_generation_logits"):
            if not isinstance(getattr(self, field), bool):
                raise InvalidRequestError(field, f"must be true or false, got {getattr(self, field)!r}")
        if self.guided_decoding is not None and not isinstance(self.guided_decoding, GuidedDecodingParams):
            raise InvalidRequestError(GUIDE_TYPE_FIELD, f"must be GuidedDecodingParams, got {type(self.guided_decoding).__name__}")
        _check_beam_params(self)
        if isinstance(self.medusa_choices, str) and not self.medusa_choices.strip():
            object.__setattr__(self, "medusa_choices", None)  # empty: the engine's tree
        if self.medusa_choices is not None and not isinstance(self.medusa_choices, str):
            try:
                object.__setattr__(self, "medusa_choices", tuple(tuple(path) for path in self.medusa_choices))
            except TypeError:
                raise InvalidRequestError("medusa_choices", f"must be a string or a list of paths, got {self.medusa_choices!r:.80}") from None

    @property
    def num_sequences(self) -> int:
        """Sequences the request runs at once: its beams, else its n samples."""
        return self.beam_width if self.beam_width > 1 else self.n

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def needs_token_history(self) -> bool:
        """Whether sampling looks at earlier tokens (penalties, bad words)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or bool(self.bad_words)

    def token_ids_to_check(self) -> Iterable[tuple[str, int]]:
        """(field, token id) pairs that must lie inside the vocabulary."""
        for field in ("end_id", "pad_id"):
            if getattr(self, field) is not None:
                yield field, getattr(self, field)
        for field in ("stop_token_ids", "bad_words"):
            for sequence in getattr(self, field):
                for token_id in sequence:
                    yield field, token_id
        for token_id, _ in self.logit_bias:
            yield "logit_bias", token_id


def ends_with_stop_sequence(tokens: Sequence[int], stop_sequences: Iterable[tuple[int, ...]]) -> bool:
    """Whether `tokens` (a sequence's generated tokens) end with one of `stop_sequences` (`stop_token_ids`)."""
    return any(len(stop) <= len(tokens) and tuple(tokens[-len(stop) :]) == stop for stop in stop_sequences)


def _check_beam_params(params: SamplingParams) -> None:
    _check_int("beam_width", params.beam_width, minimum=1)
    _check_float("length_penalty", params.length_penalty)
    if not (isinstance(params.early_stopping, bool) or params.early_stopping == "never"):
        raise InvalidRequestError("early_stopping", f'must be true, false or "never", got {params.early_stopping!r}')
    width = params.beam_width
    if width == 1:
        return
    if params.n > width:
        raise InvalidRequestError("n", f"{params.n} sequences exceed beam_width {width}: beam search returns at most beam_width sequences")
    sampling = {
        "top_k": params.top_k not in (0, 1),
        "top_p": params.top_p != 1.0,
        "temperature": params.temperature not in (0.0, 1.0),
        "return_generation_logits": params.return_generation_logits,
        "logprobs": bool(params.logprobs),
    }
    for field, refused in sampling.items():
        if refused:
            raise InvalidRequestError(
                field,
                f"{getattr(params, field)!r} with beam_width {width}: beam search does not sample and returns only "
                "each beam's tokens and log-probabilities (use the default)",
            )


def _logit_bias(pairs: Any) -> tuple[tuple[int, float], ...]:
    try:
        checked = tuple((token_id, bias) for token_id, bias in pairs)
    except (TypeError, ValueError):
        raise InvalidRequestError("logit_bias", f"must be (token id, bias) pairs, got {pairs!r:.100}") from None
    for token_id, bias in checked:
        _check_int("logit_bias", token_id, minimum=0)
        _check_float("logit_bias", bias)
    return checked


def check_temperature(value: Any) -> None:
    """A temperature a request may ask for: finite, 0 (greedy) to MAX_TEMPERATURE."""
    _check_float("temperature", value)
    if not 0 <= value <= MAX_TEMPERATURE:
        raise InvalidRequestError("temperature", f"must be between 0 and {MAX_TEMPERATURE:g}, got {value}")


def _check_int(field: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(field, f"must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidRequestError(field, f"must be >= {minimum}, got {value}")


def _check_float(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequestError(field, f"must be a finite number, got {value!r}")


def _token_sequences(field: str, value: Any) -> tuple[tuple[int, ...], ...]:
    if value is None:
        return ()
    try:
        sequences = tuple(tuple(sequence) for sequence in value)
    except TypeError:
        raise InvalidRequestError(field, f"must be a list of token-id lists, got {value!r}") from None
    for sequence in sequences:
        if not sequence:
            raise InvalidRequestError(field, "contains an empty token sequence")
        for token_id in sequence:
            if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                raise InvalidRequestError(field, f"token id {token_id!r} is not a non-negative integer")
    return sequences
