"""Triton Python model `tensorrt_llm` for the cpu target: TensorRT-LLM's tensor contract, served
by the project's reference engine (refengine) with inflight batching.

- `initialize` loads the engine directory named by the `engine_dir` parameter and starts an
  `EngineLoop` (engine steps on a background thread).
- `execute` only validates and submits; one relay thread per request turns the engine's outputs
  into responses: one per new token batch when `streaming`, one final response otherwise. The
  last response carries the FINAL flag.
- Cancellation: a watcher thread polls each in-flight request's `is_cancelled()` every
  `cancellation_check_period_ms` and aborts it in the engine, which frees its KV blocks. A
  `stop` request (TensorRT-LLM's contract) aborts every in-flight request with its request id.
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
from triton_io import error_response, log_error, optional_input

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class _InFlight:
    """One submitted request: its engine id, Triton request id and response sender."""

    def __init__(self, engine_request_id: str, triton_request_id: str, sender) -> None:
        self.engine_request_id = engine_request_id
        self.triton_request_id = triton_request_id
        self.sender = sender
        self.cancelled = False
        self.stopped = False
        self.finishing = False  # the final response is being sent; the sender must not be polled


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        parameters = ModelParameters(model_config, args["model_repository"])
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        self._exclude_input_default = parameters.boolean("exclude_input_in_output", False)
        self._check_period = parameters.integer("cancellation_check_period_ms", 100) / 1000.0
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
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="tensorrt_llm-watch", daemon=True)
        self._watcher.start()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._accept(request, sender)
            except ContractError as error:
                sender.send(error_response(str(error)), flags=FINAL)
            except Exception as error:  # never let one request take the model down
                log_error(f"tensorrt_llm: request failed: {type(error).__name__}: {error}")
                sender.send(error_response(f"request failed: {error}", pb_utils.TritonError.INTERNAL), flags=FINAL)
        return None

    def finalize(self):
        self._stopping.set()
        self._watcher.join(timeout=5)
        self._loop.stop()
        self._metrics.close()

    # -- requests ---------------------------------------------------------------------------
    def _accept(self, request, sender):
        arrays = {name: array for name in INPUT_NAMES if (array := optional_input(request, name)) is not None}
        parsed = parse_request(arrays, exclude_input_default=self._exclude_input_default, decoupled=self._decoupled)
        if isinstance(parsed, StopRequest):
            self._stop(request.request_id())
            if self._decoupled:
                sender.send(flags=FINAL)
            else:
                sender.send(pb_utils.InferenceResponse(output_tensors=[]), flags=FINAL)
            return
        try:
            stream = self._loop.submit(parsed.prompt_ids, parsed.params)
        except InvalidRequestError as error:
            raise contract_error(error) from None
        entry = _InFlight(stream.request_id, request.request_id(), sender)
        with self._lock:
            self._in_flight[entry.engine_request_id] = entry
        threading.Thread(target=self._relay, args=(stream, parsed, entry), name="tensorrt_llm-relay", daemon=True).start()

    def _stop(self, triton_request_id):
        if not triton_request_id:
            raise ContractError("stop: a stop request needs the request id of the requests to stop")
        with self._lock:
            targets = [e for e in self._in_flight.values() if e.triton_request_id == triton_request_id]
        for entry in targets:
            entry.stopped = True
            self._loop.abort(entry.engine_request_id)

    def _relay(self, stream, request: GenerateRequest, entry: _InFlight):
        try:
            final_output = None
            for output in stream:
                final_output = output
                if output.finished:
                    with self._lock:
                        entry.finishing = True
                if request.streaming:
                    self._send_streamed(request, output, entry)
            if not request.streaming:
                self._send_final(request, final_output, entry)
        except Exception as error:  # the engine failed this request; tell the client, keep serving
            log_error(f"tensorrt_llm: generation failed: {type(error).__name__}: {error}")
            entry.sender.send(error_response(f"generation failed: {error}", pb_utils.TritonError.INTERNAL), flags=FINAL)
        finally:
            with self._lock:
                self._in_flight.pop(entry.engine_request_id, None)

    def _send_streamed(self, request, output, entry):
        if output.finished and entry.cancelled:
            entry.sender.send(error_response("request cancelled", pb_utils.TritonError.CANCELLED), flags=FINAL)
            return
        responses = [_response(streamed_arrays(request, c)) for c in output.outputs if c.new_token_ids]
        for index, response in enumerate(responses):
            last = output.finished and index == len(responses) - 1
            entry.sender.send(response, flags=FINAL if last else 0)
        if output.finished and not responses:
            entry.sender.send(flags=FINAL)

    def _send_final(self, request, output, entry):
        if entry.cancelled:
            entry.sender.send(error_response("request cancelled", pb_utils.TritonError.CANCELLED), flags=FINAL)
            return
        completions = output.outputs
        for index, completion in enumerate(completions):
            flags = FINAL if index == len(completions) - 1 else 0
            entry.sender.send(_response(final_arrays(request, completion)), flags=flags)

    # -- background -------------------------------------------------------------------------
    def _watch(self):
        while not self._stopping.wait(self._check_period):
            with self._lock:
                entries = [e for e in self._in_flight.values() if not (e.cancelled or e.finishing)]
            for entry in entries:
                try:
                    cancelled = entry.sender.is_cancelled()
                except Exception as error:  # the request completed meanwhile; nothing to cancel
                    log_error(f"tensorrt_llm: cancellation check failed: {error}")
                    continue
                if cancelled:
                    entry.cancelled = True
                    self._loop.abort(entry.engine_request_id)
            try:
                self._metrics.update()
            except Exception as error:  # metrics must never stop the watcher (cancellation)
                log_error(f"tensorrt_llm: metrics update failed: {error}")


def _response(arrays):
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, value) for name, value in arrays.items()])
