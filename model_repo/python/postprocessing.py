"""Triton Python model `postprocessing`: token ids → text, incremental and UTF-8 safe.

Inputs: TOKENS_BATCH [B, beams, T] and SEQUENCE_LENGTH [B, beams] from `tensorrt_llm`, and
optional PRECEDING_IDS [B, beams, K]: the tokens that precede TOKENS_BATCH in the sequence.
Output: OUTPUT [B × beams], flat (wire shape [1] for one sequence, as NVIDIA's postprocessing and
the clients written for it expect).

With PRECEDING_IDS (the cpu `tensorrt_llm` model sends them with every response) the text is
the delta those tokens add after their context: no leading space is lost and a multi-byte
character split across responses is emitted whole, by the response that completes it. Triton
2.51 gives a composing model of an ensemble no per-stream key (the ensemble propagates only the
client's request id, and each instance is its own process), so the state a stream needs travels
with the data instead of living here. Without PRECEDING_IDS (TensorRT-LLM's C++ backend) each
response is decoded on its own, as upstream does.

One execution, one decode: the requests of an execution (several with serve.postprocessing_dynamic_batching)
are read into pieces first (postprocessing_pieces.py), then every piece is decoded by one batched call of the
tokenizer (incremental_detokenizer.text_deltas); a request that cannot be read gets its own error response and
the others their texts.

Cancellation: Triton 2.51 does not tell an in-flight decoupled model of an ensemble that the
client cancelled; it does mark the following postprocessing requests cancelled. This model then
sends TensorRT-LLM's `stop` request (same request id) to the LLM model so it ends the generation
and frees its KV cache. That needs the client to give each request a unique id (gRPC streams do,
to tell their responses apart). `is_cancelled()` is a round trip to the server, so it is asked at
most once per `cancellation_check_period_ms` (100) per request id, as the LLM model polls its own
requests, not for every streamed token; the first response of a request is not checked (it may
be the only one, and a cancellation is acted on with the next response after the period). With
dynamic batching Triton's batcher answers a cancelled request itself, before this model sees it
(serve.postprocessing_dynamic_batching says what that costs).
"""

from __future__ import annotations

import collections
import json
import time

import triton_python_backend_utils as pb_utils
from deferred_release import DeferredRelease
from hf_tokenizer import HFTokenizer
from incremental_detokenizer import text_deltas
from model_parameters import ModelParameters
from postprocessing_pieces import PostprocessingInputError, request_pieces
from triton_io import BadRequest, error_response, input_arrays, log_error, required_array, send_stop, string_tensor

_REMEMBERED_STOPS = 1024


class TritonPythonModel:
    def initialize(self, args):
        parameters = ModelParameters(json.loads(args["model_config"]), args["model_repository"])
        self.tokenizer = HFTokenizer(parameters.path("tokenizer_dir"))
        self.skip_special_tokens = parameters.boolean("skip_special_tokens", True)
        self.llm_model_name = parameters.string("llm_model_name", "tensorrt_llm")
        self._stopped_request_ids = collections.deque(maxlen=_REMEMBERED_STOPS)
        self._check_period_s = parameters.integer("cancellation_check_period_ms", 100) / 1000.0
        self._next_check: collections.OrderedDict[str, float] = collections.OrderedDict()  # request id → when to ask again
        self._finished_calls = DeferredRelease()  # the stop calls' responses (triton_io.send_stop)

    def execute(self, requests):
        self._finished_calls.release_due()
        read = [self._read(request) for request in requests]  # each request's pieces, or its error response
        pieces = [piece for outcome in read if isinstance(outcome, list) for piece in outcome]
        try:
            texts = iter(text_deltas(self._decode_batch, pieces))
        except Exception as error:  # never let one execution take the model down
            log_error(f"postprocessing failed: {type(error).__name__}: {error}")
            return [error_response(f"postprocessing failed: {error}", pb_utils.TritonError.INTERNAL) for _ in requests]
        return [
            pb_utils.InferenceResponse(output_tensors=[string_tensor("OUTPUT", [next(texts) for _ in outcome])]) if isinstance(outcome, list) else outcome
            for outcome in read
        ]

    def _read(self, request):
        """The request's pieces (sequences to decode), or the error response it gets instead."""
        try:
            if self._cancellation_due(request.request_id()) and request.is_cancelled():
                self._stop_generation(request.request_id())
            # A cancelled request still gets an ordinary response: the client is gone, and an
            # error from a composing model leaves Triton 2.51's ensemble with an in-flight
            # request that never ends (shutdown then waits for --exit-timeout-secs).
            inputs = input_arrays(request)
            return request_pieces(required_array(inputs, "TOKENS_BATCH"), required_array(inputs, "SEQUENCE_LENGTH"), inputs.get("PRECEDING_IDS"))
        except (BadRequest, PostprocessingInputError) as error:
            return error_response(str(error))
        except Exception as error:  # never let one request take the model down
            log_error(f"postprocessing failed: {type(error).__name__}: {error}")
            return error_response(f"postprocessing failed: {error}", pb_utils.TritonError.INTERNAL)

    def _cancellation_due(self, request_id):
        """Whether to ask the server if this request was cancelled (see the module docstring)."""
        if not request_id:
            return False  # a stop request needs the id
        now = time.monotonic()
        due = self._next_check.get(request_id)
        if due is not None and now < due:
            return False
        self._next_check[request_id] = now + self._check_period_s
        self._next_check.move_to_end(request_id)
        while len(self._next_check) > _REMEMBERED_STOPS:
            self._next_check.popitem(last=False)
        return due is not None

    def _decode_batch(self, sequences):
        return self.tokenizer.decode_batch(sequences, skip_special_tokens=self.skip_special_tokens)

    def _stop_generation(self, request_id):
        if not request_id or request_id in self._stopped_request_ids:
            return
        self._stopped_request_ids.append(request_id)
        for message in send_stop(self.llm_model_name, request_id, keep=self._finished_calls.hold):
            log_error(f"stop request for {request_id!r} failed: {message}")
