"""A validated OpenAI request → the Triton requests that answer it (`Plan`), or the 4xx that refuses it.

What is checked here, before anything is sent: the model name (404), the features the engine
cannot honour (400 with code `unsupported_parameter`), `n` × prompts against `max_n`, and the
context: prompt tokens (counted like the preprocessing model) against `max_input_len`, and
`max_tokens` against `max_seq_len` − prompt tokens (code `context_length_exceeded`).

Sampling follows OpenAI's defaults and TensorRT-LLM's semantics: `temperature` 0 is greedy (the
ensemble's default decoding); otherwise the engine samples with `temperature`, `top_p` (default 1)
and the `top_k` extension. With `seed`, the `i`-th of the `n` choices of a prompt gets seed
`seed + i` (mod 2**64), so choice 0 is what the same request with n = 1 gives. `max_tokens` defaults to 16 for
completions and to the rest of the context for chat completions.

Token-id prompts, top-N alternatives (`logprobs` ≥ 1, `top_logprobs` ≥ 1), the prompt's log-probs
(`echo` with `logprobs`), `logit_bias` and `max_tokens` 0 (only with `echo`) make a choice direct: it goes to the
LLM model itself (llm_path.py). Token ids must lie in the tokenizer's vocabulary. Engines built
without context / generation logits refuse the requests that need them, by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from clients.lora import LoraAdapter
from clients.openai_server.defaults import DEFAULT_MAX_N
from clients.openai_server.errors import bad_request, model_not_found, unsupported
from clients.openai_server.generation import ChoicePlan
from clients.openai_server.guided import guide_of, guide_param
from clients.openai_server.model import ServedModel
from clients.openai_server.schemas import ChatCompletionRequest, CompletionRequest, _Sampling
from clients.openai_server.templating import chat_prompt
from clients.openai_server.tokenizer import PromptTokenizer
from clients.openai_server.traffic import TrafficClass, resolve_without_table

SEED_MODULUS = 2**64


@dataclass(frozen=True)
class Plan:
    choices: tuple[ChoicePlan, ...]
    prompt_tokens: int
    stream: bool
    include_usage: bool
    logprobs: bool
    echo: tuple[str, ...] = ()  # completions with echo: the prompt of each choice, by index
    guide_param: str | None = None  # the request field of its guide, named in the server's refusal of it
    model_name: str = ""  # the `model` asked for: the served model's name or a LoRA adapter's
    traffic_class: TrafficClass | None = None  # its traffic class (traffic.py); None: the server has none


@dataclass(frozen=True)
class Context:
    """What planning needs about the server."""

    model: ServedModel
    tokenizer: PromptTokenizer
    max_n: int = DEFAULT_MAX_N
    adapters: Mapping[str, LoraAdapter] = field(default_factory=dict)  # LoRA adapters by the name clients pass as `model`


def plan_completion(request: CompletionRequest, context: Context, key_name: str | None = None) -> Plan:
    return _with_traffic_class(_with_adapter(_plan_completion(request, context), request, context), request, context, key_name)


def plan_chat(request: ChatCompletionRequest, context: Context, key_name: str | None = None) -> Plan:
    return _with_traffic_class(_with_adapter(_plan_chat(request, context), request, context), request, context, key_name)


def _with_traffic_class(plan: Plan, request: _Sampling, context: Context, key_name: str | None) -> Plan:
    """The request's traffic class (from its API key's name, `service_tier` and `priority`), its priority on every
    choice where the Triton model takes one."""
    table = context.model.traffic
    if table is None:
        resolve_without_table(request.service_tier, request.priority)
        return plan
    traffic_class = table.resolve(key_name, request.service_tier, request.priority)
    choices = plan.choices
    if context.model.takes_priority:
        choices = tuple(dataclasses.replace(choice, sampling={**choice.sampling, "priority": traffic_class.priority}) for choice in choices)
    return dataclasses.replace(plan, choices=choices, traffic_class=traffic_class)


def _with_adapter(plan: Plan, request: _Sampling, context: Context) -> Plan:
    """Every choice of `plan` with the LoRA adapter `request.model` names (none for the served model's name)."""
    adapter = context.adapters.get(request.model)
    choices = tuple(dataclasses.replace(choice, lora=adapter) for choice in plan.choices) if adapter is not None else plan.choices
    return dataclasses.replace(plan, choices=choices, model_name=request.model)


def _plan_completion(request: CompletionRequest, context: Context) -> Plan:
    _check_common(request, context)
    if request.suffix:
        raise unsupported("suffix", "suffix (insertion) is not supported")
    if request.best_of not in (None, 1, request.n or 1):
        raise unsupported("best_of", "best_of other than n is not supported")
    wants_logprobs = request.logprobs is not None
    top = request.logprobs or 0
    echo = bool(request.echo)
    if echo and request.stream:
        raise bad_request("echo is not supported with stream: the prompt (and its log-probs) comes in one piece; send stream false", param="echo")
    explicit = "max_tokens" in request.model_fields_set
    if explicit and request.max_tokens == 0 and not echo:
        raise bad_request(
            "max_tokens 0 is only allowed with echo (the prompt, and its log-probs, with nothing generated)", param="max_tokens", code="invalid_value"
        )
    prompt_logprobs = echo and wants_logprobs
    _check_logits(context, prompt_logprobs=prompt_logprobs, top=top, param="logprobs")
    bias = _logit_bias(request, context)
    prompts = request.prompts()
    choices: list[ChoicePlan] = []
    total_prompt_tokens = 0
    n = request.n or 1
    _check_choice_count(n, len(prompts), context.max_n)
    for prompt in prompts:
        text, ids = _completion_prompt(prompt, context)
        total_prompt_tokens += len(ids)
        max_tokens = _max_tokens(request.max_tokens if explicit else None, len(ids), context, default=16 if not explicit else None, allow_zero=echo)
        direct = isinstance(prompt, list) or prompt_logprobs or top > 0 or max_tokens == 0 or bias
        for sample in range(n):
            choice = _choice(request, len(choices), text, max_tokens, wants_logprobs, sample)
            if direct:
                choice = dataclasses.replace(choice, prompt_ids=tuple(ids), top_logprobs=top, prompt_logprobs=prompt_logprobs, logit_bias=bias)
            choices.append(choice)
    echoed = tuple(choice.prompt for choice in choices) if echo else ()
    return Plan(tuple(choices), total_prompt_tokens, bool(request.stream), _include_usage(request), wants_logprobs, echoed, guide_param(request))


def _plan_chat(request: ChatCompletionRequest, context: Context) -> Plan:
    _check_common(request, context)
    if request.tools or request.functions or request.tool_choice not in (None, "none") or request.function_call not in (None, "none"):
        raise unsupported("tools", "tools and function calling are not supported")
    if request.top_logprobs is not None and not request.logprobs:
        raise bad_request("top_logprobs needs logprobs set to true", param="top_logprobs")
    top = request.top_logprobs or 0
    _check_logits(context, prompt_logprobs=False, top=top, param="top_logprobs")
    bias = _logit_bias(request, context)
    if request.max_tokens is not None and request.max_completion_tokens is not None and request.max_tokens != request.max_completion_tokens:
        raise bad_request("max_tokens and max_completion_tokens differ; give one of them", param="max_completion_tokens")
    messages = []
    for position, message in enumerate(request.messages):
        if message.role in ("tool", "function") or message.tool_calls or message.function_call:
            raise unsupported(f"messages.{position}.role", "tool and function messages are not supported")
        role = "system" if message.role == "developer" else message.role
        messages.append({"role": role, "content": message.text()})
    try:
        prompt = chat_prompt(messages, context.tokenizer)
    except ValueError as error:
        raise bad_request(str(error), param="messages") from None
    prompt_ids = _prompt_ids(prompt, context, "messages")
    prompt_tokens = len(prompt_ids)
    limit = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    max_tokens = _max_tokens(limit, prompt_tokens, context, default=None)
    n = request.n or 1
    _check_choice_count(n, 1, context.max_n)
    choices = tuple(_choice(request, index, prompt, max_tokens, bool(request.logprobs), index) for index in range(n))
    if top or bias:
        choices = tuple(dataclasses.replace(choice, prompt_ids=tuple(prompt_ids), top_logprobs=top, logit_bias=bias) for choice in choices)
    return Plan(choices, prompt_tokens, bool(request.stream), _include_usage(request), bool(request.logprobs), guide_param=guide_param(request))


# -- shared checks ----------------------------------------------------------------------------
def _check_common(request: _Sampling, context: Context) -> None:
    if request.model != context.model.name and request.model not in context.adapters:
        raise model_not_found(request.model, (context.model.name, *context.adapters))
    if request.stream_options is not None and not request.stream:
        raise bad_request("The 'stream_options' parameter is only allowed when 'stream' is enabled.", param="stream_options")
    if any(not stop for stop in request.stop_sequences()):
        raise bad_request("stop sequences must not be empty strings", param="stop")


MAX_LOGIT_BIAS = 100.0  # OpenAI's range: -100 (ban) .. 100 (force)


def _logit_bias(request: _Sampling, context: Context) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias` ({"token id": bias}) as (token id, bias) pairs, each checked."""
    pairs = []
    vocab = context.tokenizer.vocab_size
    for key, bias in (request.logit_bias or {}).items():
        if not key.isdigit() or int(key) >= vocab:
            raise bad_request(f"logit_bias key {key!r} is not a token id of this model's vocabulary (0..{vocab - 1})", param="logit_bias", code="invalid_value")
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise bad_request(f"logit_bias value {bias} for token {key} is outside -100..100", param="logit_bias", code="invalid_value")
        if bias:
            pairs.append((int(key), float(bias)))
    return tuple(pairs)


def _check_choice_count(n: int, prompts: int, max_n: int) -> None:
    if n * prompts > max_n:
        what = f"n = {n}" if prompts == 1 else f"n = {n} for each of {prompts} prompts"
        raise bad_request(f"{what} asks for {n * prompts} choices; this server allows at most {max_n} per request", param="n", code="unsupported_value")


def _include_usage(request: _Sampling) -> bool:
    return bool(request.stream_options and request.stream_options.include_usage)


def _check_logits(context: Context, *, prompt_logprobs: bool, top: int, param: str) -> None:
    """Refuse what needs logits the engine was built without (the engine target's gather_*_logits)."""
    if prompt_logprobs and not context.model.context_logits:
        raise unsupported(
            "echo", "echo with logprobs needs the prompt's log-probs, and this engine was built without context logits (build.gather_context_logits)"
        )
    if top and not context.model.generation_logits:
        raise unsupported(
            param,
            f"{param} {top} needs the engine's generation logits, and this model repository does not declare them "
            "(gather_generation_logits: a repository packaged before they were; package it again); ask for the sampled "
            "token's log-probability only (0)",
        )


def _completion_prompt(prompt: str | list[int], context: Context) -> tuple[str, list[int]]:
    """(text, token ids) of one prompt: a text prompt encoded as preprocessing does; token ids checked
    against the vocabulary and `max_input_len`, and decoded as postprocessing does (what echo shows)."""
    tokenizer = context.tokenizer
    if isinstance(prompt, str):
        return prompt, _prompt_ids(prompt, context, "prompt")
    vocab = tokenizer.vocab_size
    for token_id in prompt:
        if token_id >= vocab:
            raise bad_request(f"token id {token_id} is outside the vocabulary (0..{vocab - 1})", param="prompt", code="invalid_value")
    _check_input_length(len(prompt), context, "prompt")
    return tokenizer.decode(prompt), list(prompt)


def _prompt_ids(prompt: str, context: Context, param: str) -> list[int]:
    """The prompt's token ids as preprocessing encodes them, within `max_input_len`."""
    limit = context.model.max_prompt_bytes
    if limit and (size := len(prompt.encode("utf-8", "surrogatepass"))) > limit:
        # Refused untokenized: more bytes than max_input_len tokens of this tokenizer can hold.
        raise bad_request(
            f"The prompt is {size} bytes, more than this model's maximum input length of {context.model.max_input_len} tokens "
            f"can hold (at most {limit} bytes); it was not tokenized.",
            param=param,
            code="context_length_exceeded",
        )
    ids = context.tokenizer.encode(prompt)
    if not ids:
        raise bad_request("the prompt is empty: it encodes to no tokens", param=param)
    _check_input_length(len(ids), context, param)
    return ids


def _check_input_length(tokens: int, context: Context, param: str) -> None:
    if tokens > context.model.max_input_len:
        raise bad_request(
            f"The prompt is {tokens} tokens, more than this model's maximum input length of {context.model.max_input_len} tokens.",
            param=param,
            code="context_length_exceeded",
        )


def _max_tokens(requested: int | None, prompt_tokens: int, context: Context, *, default: int | None, allow_zero: bool = False) -> int:
    room = context.model.max_seq_len - prompt_tokens
    if requested is None:
        return min(default, room) if default is not None else room
    if requested == 0 and allow_zero:
        return 0
    if requested < 1:
        raise bad_request(f"max_tokens must be at least 1, got {requested}", param="max_tokens", code="invalid_value")
    if requested > room:
        raise bad_request(
            f"max_tokens {requested} is more than this model can generate after a {prompt_tokens}-token prompt: "
            f"its context length is {context.model.max_seq_len} tokens, which leaves {room}.",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return requested


def _choice(request: _Sampling, index: int, prompt: str, max_tokens: int, logprobs: bool, sample: int) -> ChoicePlan:
    if request.min_tokens is not None and request.min_tokens > max_tokens:
        raise bad_request(f"min_tokens {request.min_tokens} is more than max_tokens {max_tokens}", param="min_tokens")
    temperature = 1.0 if request.temperature is None else request.temperature
    sampling: dict[str, Any] = {"temperature": temperature}
    if temperature > 0:
        sampling["top_p"] = 1.0 if request.top_p is None else request.top_p
        if request.top_k:
            sampling["top_k"] = request.top_k
    if request.seed is not None:
        sampling["seed"] = (request.seed + sample) % SEED_MODULUS
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens"):
        value = getattr(request, name)
        if value is not None:
            sampling[name] = value
    sampling.update(guide_of(request))
    choice = ChoicePlan(index, prompt, max_tokens, request.stop_sequences(), logprobs, sampling)
    try:
        choice.request()  # the client library's own checks (types, datatype ranges), before anything is sent
    except (TypeError, ValueError) as error:
        raise bad_request(str(error), param=getattr(error, "field", None)) from None
    return choice
