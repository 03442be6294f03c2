"""refengine outputs → the `tensorrt_llm` contract's output arrays (with Triton's batch axis).

Pure (numpy + refengine). Shapes, batch axis first: output_ids [1, beams, T], sequence_length
[1, beams], cum_log_probs [1, beams], output_log_probs [1, beams, T], batch_index and
sequence_index [1, 1], and the cpu model's extra output preceding_ids [1, beams, K] (context for
incremental detokenization, see incremental_detokenizer.py). On request, TensorRT-LLM's perf
metrics (refengine's own timestamps, KV block counts and speculative decoding's draft / accepted
token counts and acceptance rate, 0 without speculation) and token counts, each [1, 1]: num_input_tokens is the prompt's length, num_output_tokens
the tokens generated so far. TensorRT-LLM's logits, float32: context_logits [1, prompt, vocab]
(streamed: with the first response and the final one; else with the one response) and
generation_logits [1, beams, T, vocab] for the T output tokens the response carries.

Streamed responses carry the tokens generated since the previous response; the final
non-streamed response carries the whole output (prompt first unless excluded). Beam search
(`beam_arrays`): one response with every returned beam, best first, each padded to the longest
with the pad id (else the end id, else 0) and its own sequence_length; cum_log_probs is the beam's
summed log-probability (its end token included), not the length-normalised score. Streamed, every
response is such a response for the beams so far, generated tokens only, as TensorRT-LLM streams
beams (whole, since a beam may continue another from one step to the next); while the search runs
they are its best running beams and cum_log_probs their running sums.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from incremental_detokenizer import CONTEXT_TOKENS
from llm_request import GenerateRequest

from refengine import CompletionOutput, RequestMetrics

Arrays = dict[str, np.ndarray]


def streamed_arrays(request: GenerateRequest, completion: CompletionOutput, metrics: RequestMetrics | None = None, context_logits=None) -> Arrays:
    """The response for the tokens `completion` gained since the previous one (`context_logits`:
    the request's, when this response carries them)."""
    new_ids = list(completion.new_token_ids)
    arrays = _arrays(request, completion, new_ids, _context_before(request, completion, len(new_ids)), len(new_ids), metrics)
    rows = completion.new_generation_logits
    return arrays | _logit_arrays(request, context_logits, None if rows is None or not rows.numel() else rows.numpy())


def _context_before(request: GenerateRequest, completion: CompletionOutput, new: int) -> list[int]:
    """The last CONTEXT_TOKENS tokens (prompt, then generated) before the `new` newest ones, in
    O(CONTEXT_TOKENS): a streamed request asks for it with every response."""
    generated_before = len(completion.token_ids) - new
    context = list(completion.token_ids[max(0, generated_before - CONTEXT_TOKENS) : generated_before])
    missing = CONTEXT_TOKENS - len(context)
    return (list(request.prompt_ids[-missing:]) + context) if missing else context


def final_arrays(
    request: GenerateRequest,
    completion: CompletionOutput,
    metrics: RequestMetrics | None = None,
    context_logits=None,
    generation_logits: Sequence = (),
) -> Arrays:
    """The single response of a non-streamed request (`generation_logits`: the outputs' new rows, in order)."""
    generated = list(completion.token_ids)
    if request.exclude_input_in_output:
        arrays = _arrays(request, completion, generated, list(request.prompt_ids)[-CONTEXT_TOKENS:], len(generated), metrics)
    else:
        arrays = _arrays(request, completion, list(request.prompt_ids) + generated, [], len(generated), metrics)
    parts = [part for part in generation_logits if part is not None and part.numel()]
    return arrays | _logit_arrays(request, context_logits, np.concatenate([part.numpy() for part in parts]) if parts else None)


def beam_arrays(request: GenerateRequest, output, metrics: RequestMetrics | None = None, context_logits=None) -> Arrays:
    """A beam-search response (the single one, or one per step when streamed): output_ids [1, beams, T]
    and the rest per beam (`context_logits`: the request's, when this response carries them)."""
    without_prompt = request.exclude_input_in_output or request.streaming
    prompt = [] if without_prompt else list(request.prompt_ids)
    rows = [prompt + list(completion.token_ids) for completion in output.outputs]
    width = max(len(row) for row in rows)
    pad = next((value for value in (request.params.pad_id, request.params.end_id) if value is not None), 0)
    preceding = list(request.prompt_ids)[-CONTEXT_TOKENS:] if without_prompt else []
    arrays: Arrays = {
        "output_ids": np.array([row + [pad] * (width - len(row)) for row in rows], dtype=np.int32).reshape(1, len(rows), width),
        "sequence_length": np.array([[len(row) for row in rows]], dtype=np.int32),
        "batch_index": np.array([[request.batch_index]], dtype=np.int32),
        "sequence_index": np.array([[0]], dtype=np.int32),
        "preceding_ids": np.array([preceding] * len(rows), dtype=np.int32).reshape(1, len(rows), len(preceding)),
    }
    if request.return_log_probs:
        generated = max(len(completion.token_ids) for completion in output.outputs)
        log_probs = [[s.logprob for s in completion.logprobs or ()] for completion in output.outputs]
        arrays["cum_log_probs"] = np.array([[completion.cum_log_prob or 0.0 for completion in output.outputs]], dtype=np.float32)
        arrays["output_log_probs"] = np.array([row + [0.0] * (generated - len(row)) for row in log_probs], dtype=np.float32)[None]
    if request.return_num_input_tokens:
        arrays["num_input_tokens"] = _one(len(request.prompt_ids), np.int32)
    if request.return_num_output_tokens:
        arrays["num_output_tokens"] = _one(max(len(c.token_ids) for c in output.outputs), np.int32)
    if request.return_perf_metrics:
        arrays.update(perf_metric_arrays(metrics))
    return arrays | _logit_arrays(request, context_logits, None)  # beam search refuses generation logits


def _logit_arrays(request: GenerateRequest, context_logits, generation_logits) -> Arrays:
    arrays: Arrays = {}
    if request.params.return_context_logits and context_logits is not None:
        arrays["context_logits"] = context_logits.numpy().astype(np.float32, copy=False)[None]
    if request.params.return_generation_logits:
        rows = np.zeros((0, 0), dtype=np.float32) if generation_logits is None else generation_logits.astype(np.float32, copy=False)
        arrays["generation_logits"] = rows[None, None]
    return arrays


def _arrays(
    request: GenerateRequest,
    completion: CompletionOutput,
    output_ids: Sequence[int],
    preceding_ids: Sequence[int],
    log_prob_tail: int,
    metrics: RequestMetrics | None,
) -> Arrays:
    arrays: Arrays = {
        "output_ids": np.array(output_ids, dtype=np.int32).reshape(1, 1, -1),
        "sequence_length": np.array([[len(output_ids)]], dtype=np.int32),
        "batch_index": np.array([[request.batch_index]], dtype=np.int32),
        "sequence_index": np.array([[completion.index]], dtype=np.int32),
        "preceding_ids": np.array(preceding_ids, dtype=np.int32).reshape(1, 1, -1),
    }
    if request.return_log_probs:
        log_probs = [float(sample.logprob) for sample in (completion.logprobs or ()) if sample.logprob is not None]
        tail = log_probs[len(log_probs) - log_prob_tail :] if log_prob_tail else []
        arrays["cum_log_probs"] = np.array([[sum(log_probs)]], dtype=np.float32)
        arrays["output_log_probs"] = np.array(tail, dtype=np.float32).reshape(1, 1, -1)
    if request.return_num_input_tokens:
        arrays["num_input_tokens"] = _one(len(request.prompt_ids), np.int32)
    if request.return_num_output_tokens:
        arrays["num_output_tokens"] = _one(len(completion.token_ids), np.int32)
    if request.return_perf_metrics:
        arrays.update(perf_metric_arrays(metrics))
    return arrays


def perf_metric_arrays(metrics: RequestMetrics | None) -> Arrays:
    """TensorRT-LLM's per-request perf metrics; a time not reached yet is 0, as TensorRT-LLM reports it."""
    if metrics is None:
        raise ValueError("return_perf_metrics: the engine gave no metrics for this request")
    return {
        "kv_cache_alloc_new_blocks": _one(metrics.kv_new_blocks, np.int32),
        "kv_cache_reused_blocks": _one(metrics.kv_reused_blocks, np.int32),
        "kv_cache_alloc_total_blocks": _one(metrics.kv_total_blocks, np.int32),
        "arrival_time_ns": _one(metrics.arrival_time_ns, np.int64),
        "first_scheduled_time_ns": _one(metrics.first_scheduled_time_ns or 0, np.int64),
        "first_token_time_ns": _one(metrics.first_token_time_ns or 0, np.int64),
        "last_token_time_ns": _one(metrics.last_token_time_ns or 0, np.int64),
        "acceptance_rate": _one(metrics.acceptance_rate, np.float32),
        "total_accepted_draft_tokens": _one(metrics.total_accepted_draft_tokens, np.int32),
        "total_draft_tokens": _one(metrics.total_draft_tokens, np.int32),
    }


def _one(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)
