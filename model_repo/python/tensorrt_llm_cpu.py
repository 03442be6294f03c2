"""Triton Python model `tensorrt_llm` for the cpu target: TensorRT-LLM's tensor contract, served
by the project's reference engine (refengine) with inflight batching.

- `initialize` loads the engine directory named by the `engine_dir` parameter and starts an
  `EngineLoop` (engine steps on a background thread).
- `execute` reads every input its contract.json declares (written by the package stage from the
  source config.pbtxt is rendered from), validates and submits. The engine loop hands each output
  to one of a few relay threads started in `initialize` (a request's outputs always to the same
  one, so they stay in order), which turns it into responses: one per new token batch when
  `streaming` (the `stream_interval` parameter, TensorRT-LLM's LLM API option: a response on a request's
  first decoding step, then on every stream_interval-th, and the last; 1 = every token), one final
  response otherwise. The last response carries the FINAL flag. No thread
  is started per request: `Thread.start` waits until the new thread holds the GIL, which the
  engine loop's step holds for milliseconds (it was most of `execute`'s time, measured).
- Cancellation: a watcher thread polls each in-flight request's `is_cancelled()` every
  `cancellation_check_period_ms` and aborts it in the engine, which frees its KV blocks. Each
  request's sender is owned by a `ResponseChannel`, which never polls after the final response
  (Triton frees the request's response factory then; see response_channel.py). A `stop`
  request (TensorRT-LLM's contract) aborts every in-flight request with its request id.
- A request of batch B (NVIDIA's `--batch-inputs`) becomes B generations; each response carries
  its row's `batch_index` and the FINAL flag comes with the last row to finish (BatchChannel).
- Bad requests get an INVALID_ARG error response; the model and the server stay up.
- Priority: the optional `priority` input (in [0, 1], higher first, 0.5 absent) orders and preempts requests in the
  engine's scheduler; the optional `context_starvation_steps` and `context_scheduling_policy` parameters (refengine's
  EngineConfig names; defaults when absent) set its starvation guard and its order within a priority.
- Guided decoding: with the `guided_decoding_backend` parameter `xgrammar`, the engine compiles each
  request's guide against the vocabulary of the `xgrammar_tokenizer_info_path` file (refengine.guided).
- Medusa (an engine built with build.speculative.mode medusa): the `medusa_choices` parameter replaces the engine's
  tree and `decoding_mode` is overwritten to agree with the engine, as TensorRT-LLM does (medusa_parameters.py).
- Custom metrics (engine_metrics.py) report KV blocks, requests, engine iterations, tokens
  (generated; prompt tokens computed or reused), prefix-cache hits, preemptions, draft tokens and, on a
  Medusa engine, tree steps and accepted tree nodes by depth.
"""

from __future__ import annotations

import itertools
import json
import queue
import threading

import triton_python_backend_utils as pb_utils
from engine_metrics import EngineMetrics
from llm_request import ContractError, GenerateRequest, StopRequest, contract_error, parse_batch
from llm_response import beam_arrays, final_arrays, streamed_arrays
from lora_parameters import lora_settings, prefetch_adapters
from medusa_parameters import decoding_mode_warning, medusa_choices
from model_contract import load_model_contract
from model_parameters import ModelParameters
from response_channel import BatchChannel, CancellationWatcher, ResponseChannel
from triton_io import answer_each, arrays_response, error_response, input_arrays, log_error, log_warning, requested_outputs

from refengine import EngineLoop, InvalidRequestError, LLMEngine
from refengine.config import DEFAULT_CONTEXT_STARVATION_STEPS

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# Responses are sent by this many threads: a send waits for the server (an IPC round trip), so a
# few let concurrent requests' sends overlap.
RELAY_THREADS = 4


class _InFlight:
    """One submitted generation (a row of a Triton request): its parsed request, engine id (set once
    submitted), Triton request id, the batch channel its responses go through, the outputs the
    caller asked for and the relay thread its outputs go to."""

    def __init__(self, request: GenerateRequest, triton_request_id: str, batch: BatchChannel, requested: frozenset[str], relay) -> None:
        self.request = request
        self.engine_request_id: str | None = None
        self.triton_request_id = triton_request_id
        self.batch = batch
        self.row = request.batch_index
        self.requested = requested  # output names the caller asked for: the only ones sent
        self.relay = relay
        self.cancelled = False
        self.context_logits_sent = False
        self.done = False  # its last output handled (or the request refused): later items are dropped
        self.generation_logits: dict[int, list] = {}  # non-streamed: every token's row, by sequence

    def deliver(self, item) -> None:
        """The engine loop's `on_output` (on the loop's thread): hand the item to this row's relay."""
        self.relay.put((self, item))

    def send(self, response=None, *, final: bool = False) -> bool:
        return self.batch.send(self.row, response, final=final)

    @property
    def closed(self) -> bool:
        return self.batch.row_closed(self.row)


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        parameters = ModelParameters(model_config, args["model_repository"])
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        self._input_names = frozenset(load_model_contract(args["model_repository"], args["model_version"]).input_names)
        self._exclude_input_default = parameters.boolean("exclude_input_in_output", False)
        engine_dir = parameters.path("engine_dir")
        lora = lora_settings(parameters, engine_dir)
        self._serves_lora = lora is not None
        engine = LLMEngine.from_engine_dir(
            engine_dir,
            medusa_choices=medusa_choices(parameters.string("medusa_choices", "")),
            **({"lora": lora} if lora is not None else {}),
            scheduler_policy=parameters.string("batch_scheduler_policy", "guaranteed_no_evict"),
            enable_chunked_context=parameters.boolean("enable_chunked_context", False),
            enable_prefix_caching=parameters.boolean("enable_kv_cache_reuse", False),
            stream_interval=parameters.integer("stream_interval", 1),
            context_starvation_steps=parameters.integer("context_starvation_steps", DEFAULT_CONTEXT_STARVATION_STEPS),
            context_scheduling_policy=parameters.string("context_scheduling_policy", "fcfs"),
        )
        if warning := decoding_mode_warning(parameters.string("decoding_mode", ""), engine.num_medusa_heads > 0):
            log_warning(f"tensorrt_llm: {warning}")
        if parameters.string("guided_decoding_backend", "none") == "xgrammar":  # else a guide is refused by name
            engine.enable_guided_decoding(parameters.path("xgrammar_tokenizer_info_path"))
        max_beam_width = parameters.integer("max_beam_width", engine.config.max_beam_width)
        if not 1 <= max_beam_width <= engine.config.max_beam_width:  # TensorRT-LLM: at most the engine's
            raise ValueError(f"max_beam_width {max_beam_width}: must be 1 to the engine's build_config.max_beam_width {engine.config.max_beam_width}")
        engine.limit_beam_width(max_beam_width)
        if parameters.string("lora_prefetch_dir", "") != "":
            prefetch_adapters(engine, parameters.path("lora_prefetch_dir"), lambda message: log_error(f"tensorrt_llm: {message}"))
        self._loop = EngineLoop(engine).start()
        self._in_flight: dict[str, _InFlight] = {}
        self._lock = threading.Lock()
        self._relays = [queue.SimpleQueue() for _ in range(RELAY_THREADS)]
        self._next_relay = itertools.cycle(self._relays)
        self._relay_threads = [
            threading.Thread(target=self._relay, args=(relay,), name=f"tensorrt_llm-relay-{index}", daemon=True) for index, relay in enumerate(self._relays)
        ]
        for thread in self._relay_threads:
            thread.start()
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
        return answer_each(
            requests, self._accept, refusals=ContractError, model="tensorrt_llm", channel=lambda request: ResponseChannel(request.get_response_sender(), FINAL)
        )

    def finalize(self):
        self._watcher.stop()
        self._loop.stop()
        for relay in self._relays:
            relay.put(None)
        for thread in self._relay_threads:
            thread.join(5.0)
        self._metrics.close()

    # -- requests ---------------------------------------------------------------------------
    def _accept(self, request, channel):
        arrays = input_arrays(request, self._input_names)
        parsed = parse_batch(arrays, exclude_input_default=self._exclude_input_default, decoupled=self._decoupled)
        if isinstance(parsed, StopRequest):
            self._stop(request.request_id())
            channel.send(None if self._decoupled else pb_utils.InferenceResponse(output_tensors=[]), final=True)
            return
        if not self._serves_lora and any(row.lora is not None for row in parsed):
            raise ContractError(
                "lora_task_id: this engine was built without LoRA (plugin_config.lora_plugin is not set): build it with build.lora to serve adapters"
            )
        if len(parsed) > 1 and not self._decoupled:
            raise ContractError(f"input_ids: a batch of {len(parsed)} prompts needs the model in decoupled mode (one response per prompt)")
        batch = BatchChannel(channel, len(parsed))
        requested = requested_outputs(request)
        relay = next(self._next_relay)
        entries = [_InFlight(row, request.request_id(), batch, requested, relay) for row in parsed]
        streams = []
        try:
            for row, entry in zip(parsed, entries):
                streams.append(self._loop.submit(row.prompt_ids, row.params, on_output=entry.deliver, lora=row.lora, priority=row.priority))
        except InvalidRequestError as error:
            for entry in entries:
                entry.done = True  # the aborted rows' outputs are dropped
            for stream in streams:
                self._loop.abort(stream.request_id)
            prefix = f"batch row {len(streams)}: " if len(parsed) > 1 else ""
            raise ContractError(prefix + str(contract_error(error))) from None
        with self._lock:  # a row may have finished already (its relay then skipped the registry)
            for stream, entry in zip(streams, entries):
                entry.engine_request_id = stream.request_id
                if not entry.done:
                    self._in_flight[stream.request_id] = entry
        self._watcher.watch(channel, lambda: [self._cancel(entry) for entry in entries])

    def _cancel(self, entry):
        entry.cancelled = True
        if entry.engine_request_id is not None:
            self._loop.abort(entry.engine_request_id)

    def _stop(self, triton_request_id):
        if not triton_request_id:
            raise ContractError("stop: a stop request needs the request id of the requests to stop")
        with self._lock:
            targets = [e for e in self._in_flight.values() if e.triton_request_id == triton_request_id]
        for entry in targets:
            self._loop.abort(entry.engine_request_id)

    def _relay(self, items: queue.SimpleQueue):
        """A relay thread: the outputs (or errors) of the requests assigned to it, in order."""
        while (item := items.get()) is not None:
            entry, output = item
            try:
                self._handle(entry, output)
            except Exception as error:  # never let one request end the relay
                log_error(f"tensorrt_llm: relay failed: {type(error).__name__}: {error}")

    def _handle(self, entry: _InFlight, output):
        if entry.done:
            return
        request = entry.request
        try:
            if isinstance(output, BaseException):  # the engine failed this request
                raise output
            if request.streaming:
                self._send_streamed(request, output, entry)
            elif request.params.return_generation_logits:
                for completion in output.outputs:
                    entry.generation_logits.setdefault(completion.index, []).append(completion.new_generation_logits)
            if not output.finished:
                return
            if not request.streaming:
                self._send_final(request, output, entry, entry.generation_logits)
        except Exception as error:  # tell the client, keep serving
            log_error(f"tensorrt_llm: generation failed: {type(error).__name__}: {error}")
            self._fail(entry, error_response(f"generation failed: {error}", pb_utils.TritonError.INTERNAL))
        with self._lock:
            entry.done = True
            if entry.engine_request_id is not None:
                self._in_flight.pop(entry.engine_request_id, None)
        if not entry.closed:  # a finished output that did not end the row
            self._fail(entry, error_response("generation ended without a result", pb_utils.TritonError.INTERNAL))

    def _fail(self, entry, response):
        """End the whole Triton request with `response`; the batch's other rows are aborted."""
        entry.batch.fail(response)
        with self._lock:
            siblings = [e for e in self._in_flight.values() if e.batch is entry.batch]
        for sibling in siblings:
            self._loop.abort(sibling.engine_request_id)

    def _end_cancelled(self, entry):
        """End a request its client cancelled. Decoupled: with a plain final flag, not an error. In
        Triton 2.51 an error from a composing model while the ensemble's other steps (postprocessing of
        earlier tokens) are in flight races the ensemble's request tracker, which can then be used
        after it was released or never count down to 0 (the ensemble never unloads); Triton core
        fixed that in #483 (2026). This alone does not stop the heap corruption seen under heavy
        cancellation through the ensemble (docs/serving.md, "Not solved"). The client is gone anyway; Triton
        tells it the stream was cancelled."""
        if self._decoupled:
            entry.send(None, final=True)
        else:  # one response, no parallel steps: the error is safe and says what happened
            entry.send(error_response("request cancelled", pb_utils.TritonError.CANCELLED), final=True)

    def _send_streamed(self, request, output, entry):
        if output.finished and entry.cancelled:
            self._end_cancelled(entry)
            return
        if request.params.beam_width > 1:  # every beam whole, in one response per step, as TensorRT-LLM streams beams
            arrays = beam_arrays(request, output, output.metrics, _context_logits_due(entry, output, output.finished))
            entry.send(arrays_response(arrays, entry.requested), final=output.finished)
            return
        completions = [completion for completion in output.outputs if completion.new_token_ids]
        responses = []
        for index, completion in enumerate(completions):
            context_logits = _context_logits_due(entry, output, output.finished and index == len(completions) - 1)
            responses.append(arrays_response(streamed_arrays(request, completion, output.metrics, context_logits), entry.requested))
        for index, response in enumerate(responses):
            entry.send(response, final=output.finished and index == len(responses) - 1)
        if output.finished and not responses:
            entry.send(None, final=True)

    def _send_final(self, request, output, entry, generation_logits):
        if entry.cancelled:
            self._end_cancelled(entry)
            return
        if request.params.beam_width > 1:  # every beam in one response, as TensorRT-LLM returns them
            entry.send(arrays_response(beam_arrays(request, output, output.metrics, output.context_logits), entry.requested), final=True)
            return
        completions = output.outputs
        for index, completion in enumerate(completions):
            context_logits = output.context_logits if index == 0 else None
            arrays = final_arrays(request, completion, output.metrics, context_logits, generation_logits.get(completion.index, ()))
            entry.send(arrays_response(arrays, entry.requested), final=index == len(completions) - 1)


def _context_logits_due(entry, output, last):
    """A streamed request's context logits go with its first response that can carry them and again with the final
    one (NVIDIA's inflight_batcher_llm_client.py keeps the last response's)."""
    context_logits = output.context_logits if not entry.context_logits_sent or last else None
    entry.context_logits_sent = entry.context_logits_sent or context_logits is not None
    return context_logits
