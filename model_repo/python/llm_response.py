"""refengine outputs → the `tensorrt_llm` contract's output arrays (with Triton's batch axis).

Pure (numpy + refengine). Shapes, batch axis first: output_ids [1, beams, T], sequence_length
[1, beams], cum_log_probs [1, beams], output_log_probs [1, beams, T], sequence_index [1, 1], and
the cpu model's extra output preceding_ids [1, beams, K] (context for incremental detokenization,
see incremental_detokenizer.py).

Streamed responses carry the tokens generated since the previous response; the final
non-streamed response carries the whole output (prompt first unless excluded).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from incremental_detokenizer import CONTEXT_TOKENS
from llm_request import GenerateRequest
from refengine import CompletionOutput

Arrays = dict[str, np.ndarray]


def streamed_arrays(request: GenerateRequest, completion: CompletionOutput) -> Arrays:
    """The response for the tokens `completion` gained since the previous one."""
    new_ids = list(completion.new_token_ids)
    earlier = list(request.prompt_ids) + list(completion.token_ids[: len(completion.token_ids) - len(new_ids)])
    return _arrays(request, completion, new_ids, earlier[-CONTEXT_TOKENS:], log_prob_tail=len(new_ids))


def final_arrays(request: GenerateRequest, completion: CompletionOutput) -> Arrays:
    """The single response of a non-streamed request."""
    generated = list(completion.token_ids)
    if request.exclude_input_in_output:
        return _arrays(request, completion, generated, list(request.prompt_ids)[-CONTEXT_TOKENS:], len(generated))
    return _arrays(request, completion, list(request.prompt_ids) + generated, [], len(generated))


def _arrays(
    request: GenerateRequest,
    completion: CompletionOutput,
    output_ids: Sequence[int],
    preceding_ids: Sequence[int],
    log_prob_tail: int,
) -> Arrays:
    arrays: Arrays = {
        "output_ids": np.array(output_ids, dtype=np.int32).reshape(1, 1, -1),
        "sequence_length": np.array([[len(output_ids)]], dtype=np.int32),
        "sequence_index": np.array([[completion.index]], dtype=np.int32),
        "preceding_ids": np.array(preceding_ids, dtype=np.int32).reshape(1, 1, -1),
    }
    if request.return_log_probs:
        log_probs = [float(sample.logprob) for sample in (completion.logprobs or ()) if sample.logprob is not None]
        tail = log_probs[len(log_probs) - log_prob_tail :] if log_prob_tail else []
        arrays["cum_log_probs"] = np.array([[sum(log_probs)]], dtype=np.float32)
        arrays["output_log_probs"] = np.array(tail, dtype=np.float32).reshape(1, 1, -1)
    return arrays
