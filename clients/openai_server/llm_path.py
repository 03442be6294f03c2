"""Choices answered by the `tensorrt_llm` model directly instead of the ensemble: token-id prompts
(the ensemble takes text), prompt log-probs (`echo` with `logprobs`: TensorRT-LLM's
`context_logits`), the top-N alternatives of each token (`generation_logits`), `logit_bias` (its
`embedding_bias`, [1, vocab], added to the logits before sampling) and `max_tokens` 0.

The front end does what the ensemble's preprocessing and postprocessing would, with the same
tokenizer class and settings: a text prompt is encoded with the preprocessing's
`add_special_tokens`, `end_id` / `pad_id` are the tokenizer's, and the output is decoded token by
token with postprocessing's incremental detokenization (`skip_special_tokens`). Stop sequences
are matched on the text, as on the ensemble path, and the request is cancelled at a match.
`max_tokens` 0 (only with `echo`) asks the engine for one token and drops it: TensorRT-LLM
generates at least one.

Log-probabilities are computed here from the logits, log-softmax in float64, as the engine's own
`output_log_probs` are (the raw distribution, before temperature and penalties). A token's top-N
list is read from the row it was drawn from; a prompt token's from the row before it (row i of
`context_logits` predicts token i + 1), so the first prompt token has none.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import tritonclient.grpc.aio as grpcaio
from numpy.typing import NDArray
from tritonclient.utils import np_to_triton_dtype

from clients.lora import SentAdapters
from clients.openai_server.logprobs import PendingLogprobs, TokenLogprob, log_softmax, top_ids
from clients.openai_server.tokenizer import PromptTokenizer
from clients.types import INPUT_DATATYPES, llm_input_name
from model_repo.python.incremental_detokenizer import CONTEXT_TOKENS

if TYPE_CHECKING:  # generation.py imports this module
    from clients.aio import AsyncTritonLLMClient
    from clients.aio_transport import AioGrpcCall
    from clients.openai_server.generation import ChoicePlan

_NUMPY = {"INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_, "BYTES": np.object_}


@dataclass(frozen=True)
class LLMChunk:
    """One response of the `tensorrt_llm` model (streamed: the tokens since the previous one)."""

    final: bool
    output_ids: tuple[int, ...] = ()
    log_probs: tuple[float, ...] = ()
    context_logits: NDArray[Any] | None = None  # [prompt, vocab], with the first response
    generation_logits: NDArray[Any] | None = None  # [len(output_ids), vocab]


def llm_chunk(result: Any) -> LLMChunk:
    response = result.get_response()
    final = response.parameters["triton_final_response"].bool_param if "triton_final_response" in response.parameters else False
    ids = result.as_numpy("output_ids")
    if ids is None:  # the empty final response
        return LLMChunk(final)
    length = result.as_numpy("sequence_length")
    count = int(length.reshape(-1)[0]) if length is not None and length.size else ids.shape[-1]
    token_ids = tuple(int(token) for token in ids.reshape(-1)[:count])
    log_probs = result.as_numpy("output_log_probs")
    context = result.as_numpy("context_logits")
    generation = result.as_numpy("generation_logits")
    return LLMChunk(
        final,
        token_ids,
        tuple(float(value) for value in log_probs.reshape(-1)[:count]) if log_probs is not None else (),
        context.reshape(-1, context.shape[-1]) if context is not None and context.size else None,
        generation.reshape(-1, generation.shape[-1])[:count] if generation is not None and generation.size else None,
    )


def llm_request(plan: ChoicePlan, tokenizer: PromptTokenizer, sent_adapters: SentAdapters | None = None) -> tuple[list[Any], list[Any]]:
    """The `tensorrt_llm` inputs and requested outputs of one choice (batch axis first, as Triton's); `sent_adapters`:
    the client's record of the LoRA adapters whose weights it has sent (None: send them)."""
    values: dict[str, tuple[str, Any]] = {
        "input_ids": ("INT32", list(plan.prompt_ids)),
        "input_lengths": ("INT32", [len(plan.prompt_ids)]),
        "request_output_len": ("INT32", [max(1, plan.max_tokens)]),
        "streaming": ("BOOL", [True]),
        "exclude_input_in_output": ("BOOL", [True]),
        "return_log_probs": ("BOOL", [True]),
    }
    for name, token_id in (("end_id", tokenizer.end_id), ("pad_id", tokenizer.pad_id)):
        if token_id is not None:
            values[name] = ("INT32", [token_id])
    for name, value in plan.sampling.items():
        values[llm_input_name(name)] = (INPUT_DATATYPES[name], [value])
    arrays = {}
    if plan.lora is not None:  # its weights with the client's first request of the adapter, as the ensemble path sends them
        lora = plan.lora.inputs(with_weights=sent_adapters is None or sent_adapters.needs_weights(plan.lora))
        values["lora_task_id"] = ("UINT64", [lora.pop("lora_task_id")])
        arrays = lora
    outputs = ["output_ids", "sequence_length", "output_log_probs"]
    if plan.prompt_logprobs:
        values["return_context_logits"] = ("BOOL", [True])
        outputs.append("context_logits")
    if plan.top_logprobs:
        values["return_generation_logits"] = ("BOOL", [True])
        outputs.append("generation_logits")
    if plan.logit_bias:  # [1, vocab] as preprocessing builds it from embedding_bias_words
        row = [0.0] * tokenizer.vocab_size
        for token_id, bias in plan.logit_bias:
            row[token_id] = bias
        values["embedding_bias"] = ("FP32", row)
    inputs = []
    for name, (datatype, row) in values.items():
        array = np.array([row], dtype=_NUMPY[datatype])
        tensor = grpcaio.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    for name, array in arrays.items():
        tensor = grpcaio.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs, [grpcaio.InferRequestedOutput(name) for name in outputs]


def prompt_logprobs(prompt_ids: Sequence[int], context_logits: NDArray[Any] | None, top: int, tokenizer: PromptTokenizer) -> tuple[TokenLogprob, ...]:
    """Every prompt token's log-probability given the tokens before it, with offsets into the
    prompt's decoded text."""
    if context_logits is None or context_logits.shape[0] < len(prompt_ids):
        raise ValueError("the engine returned no context logits for the prompt")
    rows = log_softmax(context_logits[: len(prompt_ids)])
    items, offset = [], 0
    for position, token_id in enumerate(prompt_ids):
        text = tokenizer.text_delta(prompt_ids[max(0, position - CONTEXT_TOKENS) : position], [token_id])
        if position == 0:
            items.append(TokenLogprob(tokenizer.token_text(token_id), None, offset))
        else:
            row = rows[position - 1]
            items.append(TokenLogprob(tokenizer.token_text(token_id), float(row[token_id]), offset, _named(top_ids(row, top), tokenizer)))
        offset += len(text)
    return tuple(items)


async def llm_pieces(
    client: AsyncTritonLLMClient,
    plan: ChoicePlan,
    tokenizer: PromptTokenizer,
    model: str,
    logprobs: PendingLogprobs,
    on_open: Callable[[AioGrpcCall], AioGrpcCall],
    on_prompt: Callable[[tuple[TokenLogprob, ...]], None],
) -> AsyncGenerator[tuple[str, int], None]:
    """(text delta, output tokens so far) per response; each token's log-prob goes to `logprobs`,
    the prompt's (when asked for) to `on_prompt` before the first delta. `on_open(call)` is handed
    the call (to be cancelled)."""
    inputs, outputs = llm_request(plan, tokenizer, client.sent_adapters if plan.lora is not None else None)
    call = on_open(client.model_stream(model, inputs, outputs, llm_chunk))
    try:
        async for piece in _pieces(call, plan, tokenizer, logprobs, on_prompt):
            yield piece
    finally:
        call.cancel()  # a no-op once the final response is in


async def _pieces(
    call: AioGrpcCall, plan: ChoicePlan, tokenizer: PromptTokenizer, logprobs: PendingLogprobs, on_prompt: Callable[[tuple[TokenLogprob, ...]], None]
) -> AsyncIterator[tuple[str, int]]:
    preceding = list(plan.prompt_ids[-CONTEXT_TOKENS:])
    tokens = 0
    first = True
    async for chunk in call.chunks():
        if first and plan.prompt_logprobs:
            on_prompt(prompt_logprobs(plan.prompt_ids, chunk.context_logits, plan.top_logprobs, tokenizer))
        first = False
        if plan.max_tokens == 0:  # echo only: the one token the engine had to generate is dropped
            continue
        rows = log_softmax(chunk.generation_logits) if plan.top_logprobs and chunk.generation_logits is not None else None
        delta = []
        for position, token_id in enumerate(chunk.output_ids):
            text = tokenizer.text_delta(preceding, [token_id])
            preceding = (preceding + [token_id])[-CONTEXT_TOKENS:]
            if plan.logprobs:
                # From the row the alternatives come from (the same float64 values), else the engine's own.
                value = rows[position][token_id] if rows is not None else chunk.log_probs[position]
                top = _named(top_ids(rows[position], plan.top_logprobs), tokenizer) if rows is not None else ()
                logprobs.add_token(tokenizer.token_text(token_id), float(value), top, text)
            delta.append(text)
        tokens += len(chunk.output_ids)
        yield "".join(delta), tokens


def _named(pairs: list[tuple[int, float]], tokenizer: PromptTokenizer) -> tuple[tuple[str, float], ...]:
    return tuple((tokenizer.token_text(token_id), value) for token_id, value in pairs)
