"""Triton Python model: a stand-in for `tensorrt_llm` at a GPU's pace (benchmarks and tests only).

Never rendered into a user's repository: `bench capacity` (bench/capacity/repository.py) copies the
packaged repository and puts this code where the cpu engine's model was, so that the Python models around it
(preprocessing, postprocessing, the BLS) are measured without the cpu engine limiting them. It keeps the cpu
`tensorrt_llm` model's tensor contract (config.pbtxt unchanged: NVIDIA's names, dtypes and shapes, decoupled,
plus `preceding_ids`) and computes nothing: each request gets `request_output_len` tokens of a fixed text
(gpu_pace.py) at `standin_tokens_per_s` tokens/s per request, or as fast as the server takes them (`max`).
0, a negative or an unreadable rate is refused when the model loads, naming the parameter.

Threads: `PACERS` pacer threads share the requests (a request stays with one, so its responses stay in order);
each sends its requests' responses when they fall due, so the sends of different requests overlap. Cancellation
(the response sender's, polled every `cancellation_check_period_ms`) and TensorRT-LLM's `stop` request end a
request with a final empty response at once. The gauge `nv_trt_llm_request_metrics{request_type="active"}`
counts the requests in flight, as the cpu model's does (tests read it to see that nothing is left).
"""

from __future__ import annotations

import heapq
import itertools
import json
import threading
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils
from gpu_pace import StandinError, due_after, next_chunk, parse_rate, parse_rows, response_arrays
from model_parameters import ModelParameters
from response_channel import BatchChannel, CancellationWatcher, ResponseChannel
from triton_io import answer_each, arrays_response, error_response, input_arrays, log_error, requested_outputs

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
PACERS = 4
TOKENS_FILE = "standin_tokens.json"


class _Entry:
    """One generation in flight: its row's state, the batch channel it answers through, when it arrived."""

    def __init__(self, generation, batch: BatchChannel, requested, request_id: str) -> None:
        self.generation = generation
        self.batch = batch
        self.requested = requested
        self.request_id = request_id
        self.arrived = time.monotonic()
        self.pacer = None  # the _Pacer that sends its responses
        self.cancelled = False
        self.done = False

    def send(self, response, *, final: bool) -> bool:
        return self.batch.send(self.generation.batch_index, response, final=final)


class _Pacer:
    """A thread sending the responses of its entries when they fall due (a heap ordered by due time)."""

    def __init__(self, rate, stream_interval: int, on_done, name: str) -> None:
        self._rate, self._interval, self._on_done = rate, stream_interval, on_done
        self._heap: list = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, entry: _Entry, due: float) -> None:
        with self._ready:
            heapq.heappush(self._heap, (due, next(self._order), entry))
            self._ready.notify()

    def stop(self) -> None:
        with self._ready:
            self._stopping = True
            self._ready.notify()
        self._thread.join(5.0)

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._stopping and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._ready.wait(None if not self._heap else max(0.0, self._heap[0][0] - time.monotonic()))
                if self._stopping:
                    return
                _, _, entry = heapq.heappop(self._heap)
            try:
                self._serve(entry)
            except Exception as error:  # never let one request end the pacer
                log_error(f"tensorrt_llm (stand-in): {type(error).__name__}: {error}")
                entry.batch.fail(error_response(f"stand-in failed: {error}", pb_utils.TritonError.INTERNAL))
                self._on_done(entry)

    def _serve(self, entry: _Entry) -> None:
        if entry.done:
            return
        if entry.cancelled:
            entry.send(None, final=True)
            self._on_done(entry)
            return
        generation = entry.generation
        count = next_chunk(generation, self._interval)
        arrays = response_arrays(generation, count)
        generation.sent += count
        generation.responses += 1
        entry.send(arrays_response(arrays, entry.requested), final=generation.finished)
        if generation.finished:
            self._on_done(entry)
        else:
            self.add(entry, entry.arrived + due_after(generation.sent + next_chunk(generation, self._interval), self._rate))


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        parameters = ModelParameters(model_config, args["model_repository"])
        self._rate = parse_rate(parameters.string("standin_tokens_per_s"))
        self._interval = parameters.integer("stream_interval", 1)
        if self._interval < 1:
            raise ValueError(f"stream_interval: must be at least 1, got {self._interval}")
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        self._exclude_input_default = parameters.boolean("exclude_input_in_output", False)
        cycle_file = Path(args["model_repository"]) / str(args["model_version"]) / TOKENS_FILE
        self._cycle = [int(token) for token in json.loads(cycle_file.read_text())]
        if not self._cycle:
            raise ValueError(f"{cycle_file}: the stand-in's token cycle is empty")
        self._lock = threading.Lock()
        self._in_flight: dict[int, _Entry] = {}
        self._pacers = [_Pacer(self._rate, self._interval, self._finished, f"standin-pacer-{i}") for i in range(PACERS)]
        self._next_pacer = itertools.cycle(self._pacers)
        family = pb_utils.MetricFamily(name="nv_trt_llm_request_metrics", description="Requests in the stand-in", kind=pb_utils.MetricFamily.GAUGE)
        self._metric_family = family
        self._active = family.Metric(labels={"model": args["model_name"], "version": str(args["model_version"]), "request_type": "active"})
        self._watcher = CancellationWatcher(
            parameters.integer("cancellation_check_period_ms", 100) / 1000.0,
            on_error=lambda message: log_error(f"tensorrt_llm (stand-in): {message}"),
            every_period=lambda: self._active.set(float(len(self._in_flight))),
            name="standin-watch",
        ).start()

    def execute(self, requests):
        return answer_each(
            requests,
            self._accept,
            refusals=StandinError,
            model="tensorrt_llm (stand-in)",
            channel=lambda request: ResponseChannel(request.get_response_sender(), FINAL),
        )

    def finalize(self):
        self._watcher.stop()
        for pacer in self._pacers:
            pacer.stop()
        del self._active
        del self._metric_family

    def _accept(self, request, channel):
        arrays = input_arrays(request)
        rows = parse_rows(arrays, cycle=self._cycle, decoupled=self._decoupled, exclude_input_default=self._exclude_input_default)
        if rows is None:  # TensorRT-LLM's stop request: end the in-flight requests with this request id
            with self._lock:
                stopped = [entry for entry in self._in_flight.values() if entry.request_id == request.request_id()]
            self._cancel(stopped)
            channel.send(None if self._decoupled else pb_utils.InferenceResponse(output_tensors=[]), final=True)
            return
        batch = BatchChannel(channel, len(rows))
        requested = requested_outputs(request)
        entries = [_Entry(row, batch, requested, request.request_id()) for row in rows]
        pacer = next(self._next_pacer)  # the rows of one request share a pacer: their FINAL flag goes last
        with self._lock:
            for entry in entries:
                entry.pacer = pacer
                self._in_flight[id(entry)] = entry
        for entry in entries:
            pacer.add(entry, entry.arrived + due_after(next_chunk(entry.generation, self._interval), self._rate))
        self._watcher.watch(channel, lambda: self._cancel(entries))

    def _cancel(self, entries):
        for entry in entries:
            if not entry.done:
                entry.cancelled = True
                entry.pacer.add(entry, time.monotonic())  # due now: it ends with its pacer's next turn

    def _finished(self, entry):
        entry.done = True
        with self._lock:
            self._in_flight.pop(id(entry), None)
