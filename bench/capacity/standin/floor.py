"""Triton Python model: a postprocessing that decodes nothing (bench only, `floor_postprocessing`).

It answers every request as postprocessing does, OUTPUT with one (empty) text per sequence, after reading only the
shape of TOKENS_BATCH: what is left of a postprocessing step's cost is the Python backend's own (the request and
response through shared memory, the messages between tritonserver and the stub), the floor under any
postprocessing model in this place.
"""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
            sequences = tokens.shape[0] * (tokens.shape[1] if tokens.ndim == 3 else 1)
            texts = np.array([b""] * sequences, dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", texts)]))
        return responses
