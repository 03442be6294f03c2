"""What a client sends (`GenerationRequest` → the ensemble's inputs) and gets back (`Completion`).

Only the served contract is used: the ensemble's input names and datatypes (its config.pbtxt)
and its `text_output` / `output_log_probs` / `cum_log_probs` outputs.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from clients.errors import InvalidRequestError, ProtocolError, RequestError

# The ensemble's inputs this client sends, with their Triton datatypes (shapes are [1, 1] or [1, n]).
# A unit test (tests/pipeline/render/test_contract.py) checks both tables against the served contract.
INPUT_DATATYPES: dict[str, str] = {
    "text_input": "BYTES",
    "max_tokens": "INT32",
    "bad_words": "BYTES",
    "stop_words": "BYTES",
    "end_id": "INT32",
    "pad_id": "INT32",
    "temperature": "FP32",
    "top_k": "INT32",
    "top_p": "FP32",
    "repetition_penalty": "FP32",
    "presence_penalty": "FP32",
    "frequency_penalty": "FP32",
    "min_tokens": "INT32",
    "seed": "UINT64",
    "beam_width": "INT32",
    "length_penalty": "FP32",
    "return_log_probs": "BOOL",
    "exclude_input_in_output": "BOOL",
    "stream": "BOOL",
    "guided_decoding_guide_type": "BYTES",
    "guided_decoding_guide": "BYTES",
    "lora_task_id": "UINT64",
    "priority": "FP32",
}
# Array inputs, sent as the numpy arrays they are (their datatype is the array's: lora_weights the engine's LoRA dtype).
ARRAY_INPUTS = ("lora_weights", "lora_config")
# The ensemble passes its sampling inputs straight to `tensorrt_llm`, under the same names but these
# (for callers of that model itself: the OpenAI front end's token-level path; see llm_input_name).
LLM_INPUT_RENAMES: dict[str, str] = {"top_k": "runtime_top_k", "top_p": "runtime_top_p", "stream": "streaming", "length_penalty": "len_penalty"}
TEXT_OUTPUT = "text_output"
_INTEGER_RANGES: dict[str, tuple[int, int]] = {"INT32": (-(2**31), 2**31 - 1), "UINT64": (0, 2**64 - 1)}
_FP32_MAX = 3.4028234663852886e38


def check_input(name: str, value: Any) -> Any:
    """`value` as the JSON value of the ensemble input `name` (a Python int, float, bool, str or list
    of str), or InvalidRequestError naming the input. Ranges are the datatype's, nothing more: the
    server checks the rest (e.g. max_tokens >= 1) and names the problem itself."""
    if name in ARRAY_INPUTS:
        if getattr(value, "ndim", None) == 3 and value.shape[0] == 1:
            return value
        raise InvalidRequestError(name, f"{name} must be a numpy array of shape [1, rows, n], got {_shown(value)}")
    datatype = INPUT_DATATYPES.get(name)
    if datatype is None:
        raise InvalidRequestError(name, f"unknown input {name!r}; the ensemble's inputs are {', '.join(INPUT_DATATYPES)}")
    if datatype == "BYTES":
        if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(item, str) for item in value)):
            return value
        raise InvalidRequestError(name, f"{name} must be a string or a non-empty list of strings, got {_shown(value)}")
    if datatype == "BOOL":
        if isinstance(value, bool):
            return value
        raise InvalidRequestError(name, f"{name} must be true or false, got {_shown(value)}")
    if datatype in _INTEGER_RANGES:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise InvalidRequestError(name, f"{name} must be an integer, got {_shown(value)}")
        low, high = _INTEGER_RANGES[datatype]
        if not low <= value <= high:  # type: ignore[operator]  # typeshed's numbers.Real lacks __ge__, which int <= Integral reflects to
            raise InvalidRequestError(name, f"{name} {value} is out of range: the input is {datatype} ({low}..{high})")
        return int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # FP32
        raise InvalidRequestError(name, f"{name} must be a number, got {_shown(value)}")
    if not math.isfinite(value):
        raise InvalidRequestError(name, f"{name} must be a finite number, got {value}")
    if abs(value) > _FP32_MAX:  # type: ignore[operator]  # typeshed's Real.__abs__ returns _RealLike, which declares no comparisons
        raise InvalidRequestError(name, f"{name} {value} is out of range: the input is FP32")
    return float(value)


def llm_input_name(name: str) -> str:
    """The `tensorrt_llm` input the ensemble passes the input `name` (one it passes straight through) to."""
    return LLM_INPUT_RENAMES.get(name, name)


def check_inputs(values: Mapping[str, Any]) -> dict[str, Any]:
    """Every input checked by `check_input` (what the transports send)."""
    return {name: check_input(name, value) for name, value in values.items()}


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _words(value: str | Sequence[str] | None, name: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if not isinstance(value, Sequence) or not all(isinstance(word, str) for word in value):
        raise InvalidRequestError(name, f"{name} must be a string or a sequence of strings, got {_shown(value)}")
    return list(value) or None


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt and how to continue it.

    Types and datatype ranges are checked here (InvalidRequestError, also a TypeError and a
    ValueError, naming the field); everything else by the server, which names the input.

    Decoding follows TensorRT-LLM: greedy unless `top_k` or `top_p` is set (and `temperature` > 0).
    `stop` and `bad_words` are words or phrases (text, not token ids). `return_log_probs` makes
    the server return per-token log-probs, from which `Completion.num_tokens` and
    `Completion.finish_reason` are known. `beam_width` > 1: beam search (greedy only; streamed by `stream_beams`, not as text deltas);
    every beam comes back, best first (`Completion.beams`), `length_penalty` as TensorRT-LLM's.
    """

    prompt: str
    max_tokens: int
    temperature: float | None = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | Sequence[str] | None = None
    bad_words: str | Sequence[str] | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_tokens: int | None = None
    end_id: int | None = None
    pad_id: int | None = None
    exclude_input_in_output: bool | None = None
    return_log_probs: bool = False
    # guided decoding (TensorRT-LLM's guide types: json, json_schema, regex, ebnf_grammar, structural_tag)
    guided_decoding_guide_type: str | None = None
    guided_decoding_guide: str | None = None
    beam_width: int | None = None
    length_penalty: float | None = None
    lora: Any = None  # a clients.lora.LoraAdapter: its task id, with its weights unless `inputs(lora_weights=False)`
    # in [0, 1], higher first (TensorRT-LLM's polarity; docs/traffic-classes.md): only repositories whose LLM model takes
    # a priority (the cpu target) declare the input; None sends none (the engine's default, 0.5)
    priority: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str):
            raise InvalidRequestError("prompt", f"prompt must be a string, got {_shown(self.prompt)}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, numbers.Integral):
            raise InvalidRequestError("max_tokens", f"max_tokens must be an integer, got {_shown(self.max_tokens)}")
        if not isinstance(self.return_log_probs, bool):
            raise InvalidRequestError("return_log_probs", f"return_log_probs must be true or false, got {_shown(self.return_log_probs)}")
        self.inputs(stream=False)  # every other field
        if self.priority is not None and not 0.0 <= self.priority <= 1.0:
            raise InvalidRequestError("priority", f"priority must lie in [0, 1] (higher runs first), got {self.priority}")

    def inputs(self, *, stream: bool, whole_beams: bool = False, lora_weights: bool = True) -> dict[str, Any]:
        """The ensemble's inputs by name (None values left out): a JSON body for HTTP generate (but lora_weights /
        lora_config, numpy arrays). `whole_beams`: a beam stream (`stream_beams`), whose every response holds the beams
        whole. `lora_weights` False: the adapter's task id alone (the server has cached it)."""
        if stream and not whole_beams and self.beam_width is not None and self.beam_width > 1:
            raise InvalidRequestError(
                "beam_width",
                f"beam_width {self.beam_width} is not streamed as text deltas: streamed beams come whole at every step "
                "(as TensorRT-LLM streams them); use stream_beams(), or ask without streaming (generate(), or infer "
                "without --stream)",
            )
        values: dict[str, Any] = {
            "text_input": self.prompt,
            "max_tokens": self.max_tokens,
            "stop_words": _words(self.stop, "stop"),
            "bad_words": _words(self.bad_words, "bad_words"),
            "end_id": self.end_id,
            "pad_id": self.pad_id,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "repetition_penalty": self.repetition_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "min_tokens": self.min_tokens,
            "seed": self.seed,
            "beam_width": self.beam_width,
            "length_penalty": self.length_penalty,
            "return_log_probs": self.return_log_probs or None,
            "exclude_input_in_output": self.exclude_input_in_output,
            "stream": stream,
            "guided_decoding_guide_type": self.guided_decoding_guide_type,
            "guided_decoding_guide": self.guided_decoding_guide,
            "priority": self.priority,
            **(self.lora.inputs(with_weights=lora_weights) if self.lora is not None else {}),
        }
        return check_inputs({name: value for name, value in values.items() if value is not None})


@dataclass(frozen=True)
class Chunk:
    """One response of the server: a text delta (the whole text when not streaming)."""

    text: str
    num_tokens: int | None = None  # tokens this response covers; known only with log-probs
    cum_log_prob: float | None = None
    final: bool = False
    log_probs: tuple[float, ...] | None = field(default=None, compare=False)  # per token, when asked for
    beams: tuple[str, ...] = ()  # beam search: every beam's text, best first (`text` is the best)
    beam_cum_log_probs: tuple[float, ...] = ()  # beam search with log-probs: each beam's


@dataclass(frozen=True)
class Completion:
    """The answer to one request.

    `num_tokens`, `cum_log_prob` and `finish_reason` ("length" or "stop": end token or stop word)
    are known only when the request asked for log-probs; the ensemble reports nothing else about
    how generation ended.
    """

    text: str
    latency_s: float
    time_to_first_response_s: float | None = None
    num_responses: int = 1
    num_tokens: int | None = None
    cum_log_prob: float | None = None
    finish_reason: str | None = None
    protocol: str = ""
    beams: tuple[str, ...] = ()  # beam search: every beam's text, best first (`text` is the best)
    beam_cum_log_probs: tuple[float, ...] = ()


def chunk_from_json(payload: Mapping[str, Any], *, status: int | None = None, final: bool = False) -> Chunk:
    """A generate / generate_stream JSON object → a Chunk; `{"error": ...}` → RequestError."""
    if "error" in payload:
        raise RequestError(status, str(payload["error"]))
    text = payload.get(TEXT_OUTPUT)
    beams: tuple[str, ...] = ()
    if isinstance(text, list) and len(text) > 1:  # beam search: one text per beam
        beams = tuple(str(part) for part in text)
        text = beams[0]
    elif isinstance(text, list):  # an output of shape [n] comes back as a list
        text = "".join(str(part) for part in text)
    if not isinstance(text, str):
        raise ProtocolError(f"response has no {TEXT_OUTPUT!r} text: {dict(payload)!r:.300}")
    log_probs = payload.get("output_log_probs")
    num_tokens = None
    if log_probs is not None:
        num_tokens = len(_flatten(log_probs))
    cum = _flatten(payload.get("cum_log_probs")) if payload.get("cum_log_probs") is not None else []
    cum_log_prob = float(cum[0] if beams else cum[-1]) if cum else None
    values = None if log_probs is None else tuple(float(value) for value in _flatten(log_probs))
    return Chunk(
        text=text,
        num_tokens=None if beams else num_tokens,
        cum_log_prob=cum_log_prob,
        final=final,
        log_probs=None if beams else values,
        beams=beams,
        beam_cum_log_probs=tuple(float(value) for value in cum) if beams else (),
    )


def json_object(body: bytes) -> dict[str, Any]:
    """A `generate` answer body as a JSON object."""
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as error:
        raise ProtocolError(f"generate answered non-JSON ({error}): {body[:200]!r}") from None
    if not isinstance(payload, dict):
        raise ProtocolError(f"generate answered a JSON {type(payload).__name__}, not an object")
    return payload


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [item for part in value for item in _flatten(part)]
    return [value]
