"""The OpenAI API's request and response bodies (the subset this server implements), as pydantic models.

Requests are validated strictly, from the JSON text: a value of the wrong JSON type (`"n": "2"`,
`"max_tokens": true`, `"n": 2.5`) and an unknown field are errors, as OpenAI's own API answers
them (400); a whole number written with a fraction (`"n": 2.0`) is the integer it equals, as in
JSON Schema. Fields OpenAI defines that this server cannot honour are still declared, so that
`planning` refuses them with a message saying why rather than "unknown field". Three extensions
that vLLM and trtllm-serve accept too map to the ensemble's inputs: `top_k`, `min_tokens`,
`repetition_penalty`.

The JSON schemas say what the validators below accept: where a field is checked by a validator
(`prompt`, `stop`, `content`), its schema is given explicitly. `/openapi.json` documents them
with what `planning` refuses on top (`openapi`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic.config import JsonDict

from clients.openai_server.defaults import MAX_COMPLETION_LOGPROBS, MAX_TOP_LOGPROBS
from clients.openai_server.prompts import PROMPT_SCHEMAS, checked_prompt, prompt_list

MAX_STOP_SEQUENCES = 4  # as OpenAI's API
FinishReason = Literal["stop", "length"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool | None = None


_TEXT_PART_SCHEMA: JsonDict = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
    "additionalProperties": False,
}
_STOP_SCHEMA: JsonDict = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP_SEQUENCES},
        {"type": "null"},
    ],
    "default": None,
    "description": f"Up to {MAX_STOP_SEQUENCES} sequences; the answer ends before the first occurrence.",
}


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# 2.0 is 2 (JSON has numbers, not ints and floats); bounds go inside, so that they apply after that.
Integer = Annotated[int, BeforeValidator(_whole)]
AtLeastOne = Annotated[int, Field(ge=1), BeforeValidator(_whole)]
AtLeastZero = Annotated[int, Field(ge=0), BeforeValidator(_whole)]
Seed = Annotated[int, Field(ge=0, le=2**64 - 1), BeforeValidator(_whole)]


class ResponseFormat(_Strict):
    type: str
    json_schema: dict[str, Any] | None = None


class _Sampling(_Strict):
    """What completions and chat completions share."""

    model: str
    max_tokens: Integer | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    n: AtLeastOne | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(default=None, json_schema_extra=_STOP_SCHEMA)
    seed: Seed | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # the traffic class (traffic.py): OpenAI's service_tier, and vLLM's priority (an integer, lower first)
    service_tier: str | None = None
    priority: Integer | None = None
    # extensions (vLLM / trtllm-serve)
    top_k: AtLeastZero | None = None
    min_tokens: AtLeastZero | None = None
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    # structured output: OpenAI's response_format, and vLLM's guided_* extensions (guided.py)
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ValueError("stop must be a string or a list of strings")
        if len(value) > MAX_STOP_SEQUENCES:
            raise ValueError(f"stop takes at most {MAX_STOP_SEQUENCES} sequences, got {len(value)}")
        return value

    def stop_sequences(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(_Sampling):
    """POST /v1/completions. `prompt`: a string, a list of strings, a list of token ids, or a list of
    token-id lists (one answer each)."""

    prompt: Any = Field(
        json_schema_extra={
            "anyOf": PROMPT_SCHEMAS,
            "description": "A string, a non-empty list of strings, a list of token ids, or a list of token-id lists (one answer each).",
        }
    )
    max_tokens: Integer | None = 16  # OpenAI's default for completions; 0 only with echo
    logprobs: Annotated[int, Field(ge=0, le=MAX_COMPLETION_LOGPROBS), BeforeValidator(_whole)] | None = None
    echo: bool | None = None
    best_of: AtLeastOne | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value
        return checked_prompt(value)

    def prompts(self) -> list[str | list[int]]:
        """Each prompt: text, or token ids."""
        return prompt_list(self.prompt)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Any = Field(
        default=None,
        json_schema_extra={"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART_SCHEMA}, {"type": "null"}]},
    )
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None
    refusal: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(part, dict) for part in value):
            parts = []
            for part in value:
                if part.get("type") != "text":
                    raise ValueError(f"content parts of type {part.get('type')!r} are not supported; only 'text'")
                parts.append(TextPart.model_validate(part))
            return parts
        raise ValueError("content must be a string or a list of text parts")

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Integer | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS), BeforeValidator(_whole)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    functions: list[dict[str, Any]] | None = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None


# -- responses ----------------------------------------------------------------------------------
class ErrorObject(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error answer: OpenAI's shape."""

    error: ErrorObject


class Health(BaseModel):
    status: Literal["ok"]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "trtllm-pipeline"
    root: str | None = None  # vLLM's fields: the model's own name; for a LoRA adapter, its name and the base model (parent)
    parent: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]  # None: a prompt's first token (echo), which nothing predicts
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ChatTokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[dict[str, Any]] = []


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]
    refusal: None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
