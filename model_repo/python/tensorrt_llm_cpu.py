"""Triton Python model `tensorrt_llm` for the cpu target: TensorRT-LLM's tensor contract, served
by the project's reference engine (refengine) with inflight batching.

- `initialize` loads the engine directory named by the `engine_dir` parameter and starts an
  `EngineLoop` (engine steps on a background thread).
- `execute` only validates and submits; one relay thread per request turns the engine's outputs
  into responses: one per new token batch when `streaming`, one final response otherwise. The
  last response carries the FINAL flag.
- Cancellation: a watcher thread polls each in-flight request's `is_cancelled()` every
  `cancellation_check_period_ms` and aborts it in the engine, which frees its KV blocks. Each
  request's sender is owned by a `ResponseChannel`, which never polls after the final response
  (Triton frees the request's response factory then; see response_channel.py). A `stop`
  request (TensorRT-LLM's contract) aborts every in-flight request with its request id.
- Bad requests get an INVALID_ARG error response; the model and the server stay up.
- Custom metrics (engine_metrics.py) report KV blocks, requests, engine iterations, tokens
  (generated; prompt tokens computed or reused), prefix-cache hits and preemptions.
"""

from __future__ import annotations

import json
import threading

import triton_python_backend_utils as pb_utils
from engine_metrics import EngineMetrics
from llm_request import INPUT_NAMES, ContractError, GenerateRequest, StopRequest, contract_error, parse_request
from llm_response import final_arrays, streamed_arrays
from model_parameters import ModelParameters
from refengine import EngineLoop, InvalidRequestError, LLMEngine
from response_channel import CancellationWatcher, ResponseChannel
from triton_io import arrays_response, error_response, log_error, optional_input, requested_outputs

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class _InFlight:
    """One submitted request: its engine id, Triton request id and response channel."""

    def __init__(self, engine_request_id: str, triton_request_id: str, channel: ResponseChannel, requested: frozenset[str]) -> None:
        self.engine_request_id = engine_request_id
        self.triton_request_id = triton_request_id
        self.channel = channel
        self.requested = requested  # output names the caller asked for: the only ones sent
        self.cancelled = False


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        parameters = ModelParameters(model_config, args["model_repository"])
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        self._exclude_input_default = parameters.boolean("exclude_input_in_output", False)
        engine = LLMEngine.from_engine_dir(
            parameters.path("engine_dir"),
            scheduler_policy=parameters.string("batch_scheduler_policy", "guaranteed_no_evict"),
            enable_chunked_context=parameters.boolean("enable_chunked_context", False),
            enable_prefix_caching=parameters.boolean("enable_kv_cache_reuse", False),
        )
        self._loop = EngineLoop(engine).start()
        self._in_flight: dict[str, _InFlight] = {}
        self._lock = threading.Lock()
        labels = {"model": args["model_name"], "version": str(args["model_version"])}
        self._metrics = EngineMetrics(engine, labels, active_requests=lambda: len(self._in_flight))
        self._metrics.update()
        self._watcher = CancellationWatcher(
            parameters.integer("cancellation_check_period_ms", 100) / 1000.0,
            on_error=lambda message: log_error(f"tensorrt_llm: {message}"),
            every_period=self._metrics.update,
            name="tensorrt_llm-watch",
        ).start()

    def execute(self, requests):
        for request in requests:
            channel = ResponseChannel(request.get_response_sender(), FINAL)
            try:
                self._accept(request, channel)
            except ContractError as error:
                channel.send(error_response(str(error)), final=True)
            except Exception as error:  # never let one request take the model down
                log_error(f"tensorrt_llm: request failed: {type(error).__name__}: {error}")
                channel.send(error_response(f"request failed: {error}", pb_utils.TritonError.INTERNAL), final=True)
        return None

    def finalize(self):
        self._watcher.stop()
        self._loop.stop()
        self._metrics.close()

    # -- requests ---------------------------------------------------------------------------
    def _accept(self, request, channel):
        arrays = {name: array for name in INPUT_NAMES if (array := optional_input(request, name)) is not None}
        parsed = parse_request(arrays, exclude_input_default=self._exclude_input_default, decoupled=self._decoupled)
        if isinstance(parsed, StopRequest):
            self._stop(request.request_id())
            channel.send(None if self._decoupled else pb_utils.InferenceResponse(output_tensors=[]), final=True)
            return
        try:
            stream = self._loop.submit(parsed.prompt_ids, parsed.params)
        except InvalidRequestError as error:
            raise contract_error(error) from None
        entry = _InFlight(stream.request_id, request.request_id(), channel, requested_outputs(request))
        with self._lock:
            self._in_flight[entry.engine_request_id] = entry
        self._watcher.watch(channel, lambda: self._cancel(entry))
        threading.Thread(target=self._relay, args=(stream, parsed, entry), name="tensorrt_llm-relay", daemon=True).start()

    def _cancel(self, entry):
        entry.cancelled = True
        self._loop.abort(entry.engine_request_id)

    def _stop(self, triton_request_id):
        if not triton_request_id:
            raise ContractError("stop: a stop request needs the request id of the requests to stop")
        with self._lock:
            targets = [e for e in self._in_flight.values() if e.triton_request_id == triton_request_id]
        for entry in targets:
            self._loop.abort(entry.engine_request_id)

    def _relay(self, stream, request: GenerateRequest, entry: _InFlight):
        channel = entry.channel
        try:
            final_output = None
            for output in stream:
                final_output = output
                if request.streaming:
                    self._send_streamed(request, output, entry)
            if not request.streaming:
                self._send_final(request, final_output, entry)
        except Exception as error:  # the engine failed this request; tell the client, keep serving
            log_error(f"tensorrt_llm: generation failed: {type(error).__name__}: {error}")
            channel.send(error_response(f"generation failed: {error}", pb_utils.TritonError.INTERNAL), final=True)
        finally:
            self._watcher.forget(channel)
            with self._lock:
                self._in_flight.pop(entry.engine_request_id, None)
            if not channel.closed:  # an output stream that ended without a finished output
                channel.send(error_response("generation ended without a result", pb_utils.TritonError.INTERNAL), final=True)

    def _send_streamed(self, request, output, entry):
        channel = entry.channel
        if output.finished and entry.cancelled:
            channel.send(_cancelled_response(), final=True)
            return
        responses = [arrays_response(streamed_arrays(request, c), entry.requested) for c in output.outputs if c.new_token_ids]
        for index, response in enumerate(responses):
            channel.send(response, final=output.finished and index == len(responses) - 1)
        if output.finished and not responses:
            channel.send(None, final=True)

    def _send_final(self, request, output, entry):
        channel = entry.channel
        if entry.cancelled:
            channel.send(_cancelled_response(), final=True)
            return
        completions = output.outputs
        for index, completion in enumerate(completions):
            channel.send(arrays_response(final_arrays(request, completion), entry.requested), final=index == len(completions) - 1)


def _cancelled_response():
    return error_response("request cancelled", pb_utils.TritonError.CANCELLED)
