"""The tensorrt_llm_bls model's calls of its composing models, and what it reads from the tensors they exchange.

A top-level module to Triton, copied beside tensorrt_llm_bls.py (pipeline/render/repository.py).
"""

from __future__ import annotations

import triton_python_backend_utils as pb_utils


class UpstreamError(Exception):
    """A composing model answered with an error; forwarded to the client with its code."""

    def __init__(self, error) -> None:
        super().__init__(error.message())
        self.triton_error = error


def call_model(model_name, arrays, outputs):
    """One (non-decoupled) call of `model_name` with `arrays` as its inputs: its `outputs` by name, as numpy arrays."""
    response = pb_utils.InferenceRequest(
        model_name=model_name,
        requested_output_names=outputs,
        inputs=[pb_utils.Tensor(name, array) for name, array in arrays.items()],
    ).exec()
    if response.has_error():
        raise UpstreamError(response.error())
    return {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}


def client_flag(client, name):
    return name in client and bool(client[name].reshape(-1)[0])


def stop_words(stop_words_list):
    """TensorRT-LLM's [1, 2, N] stop_words_list (token ids, then the cumulative end offsets padded with -1) as words."""
    if stop_words_list is None or stop_words_list.size == 0:
        return []
    ids, ends = stop_words_list.reshape(2, -1).tolist()
    words, start = [], 0
    for end in ends:
        if end < 0:
            break
        words.append(ids[start:end])
        start = end
    return words
