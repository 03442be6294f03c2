"""`EngineLoop`: runs `LLMEngine.step` on a background thread for concurrent submitters.

`submit` may be called from any thread; it returns a `RequestStream` that yields the request's
outputs as they are produced (and ends after the finished one). This is what a Triton Python
model (decoupled, streaming) wraps. A caller that serves many requests from a few threads of its
own passes `on_output` instead: the loop's thread then hands it each output (or the error that
ended the request) as it is produced, and the stream is not iterated.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterator, Sequence

from refengine.engine import LLMEngine
from refengine.lora.request import LoraRequest
from refengine.outputs import RequestOutput
from refengine.priority import DEFAULT_PRIORITY
from refengine.sampling import SamplingParams

_IDLE_WAIT_SECONDS = 0.05


class RequestStream:
    """Outputs of one submitted request, in order; iterate it, or call `result()`."""

    def __init__(self, request_id: str, on_output: Callable[[RequestOutput | BaseException], None] | None = None) -> None:
        self.request_id = request_id
        self._queue: queue.Queue[RequestOutput | BaseException] = queue.Queue()
        self._on_output = on_output

    def _put(self, item: RequestOutput | BaseException) -> None:
        if self._on_output is not None:
            self._on_output(item)
        else:
            self._queue.put(item)

    def __iter__(self) -> Iterator[RequestOutput]:
        while True:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finished:
                return

    def result(self) -> RequestOutput:
        """Block until the request finishes; its final output."""
        final = None
        for output in self:
            final = output
        if final is None:
            raise RuntimeError(f"request {self.request_id} ended without output")
        return final


class EngineLoop:
    def __init__(self, engine: LLMEngine) -> None:
        self._engine = engine
        self._streams: dict[str, RequestStream] = {}
        self._streams_lock = threading.Lock()
        self._work_available = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._ids = itertools.count()

    @property
    def engine(self) -> LLMEngine:
        return self._engine

    def start(self) -> EngineLoop:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="refengine-loop", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the loop; requests still running are aborted."""
        self._stopping.set()
        self._work_available.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._streams_lock:
            request_ids = list(self._streams)
        for request_id in request_ids:
            self._engine.abort(request_id)
        self._deliver(self._engine.step())

    def __enter__(self) -> EngineLoop:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        on_output: Callable[[RequestOutput | BaseException], None] | None = None,
        lora: LoraRequest | None = None,
        priority: float = DEFAULT_PRIORITY,
    ) -> RequestStream:
        """Queue a request (thread-safe), with its LoRA adapter if any and its priority (in [0, 1], higher first).
        Raises `InvalidRequestError` for a bad input.

        `on_output`, if given, is called on the loop's thread with every output of the request
        (the last one finished) or the exception that ended it; it must be quick (hand the item
        to another thread) and must not raise."""
        request_id = f"loop-{next(self._ids)}"
        stream = RequestStream(request_id, on_output)
        with self._streams_lock:  # registered before the engine can produce its first output
            self._streams[request_id] = stream
        try:
            self._engine.add_request(prompt_token_ids, params, request_id=request_id, lora=lora, priority=priority)
        except BaseException:
            with self._streams_lock:
                self._streams.pop(request_id, None)
            raise
        self._work_available.set()
        return stream

    def abort(self, request_id: str) -> None:
        self._engine.abort(request_id)
        self._work_available.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            if not self._engine.has_unfinished():
                self._work_available.wait(_IDLE_WAIT_SECONDS)
                self._work_available.clear()
                continue
            try:
                outputs = self._engine.step()
            except Exception as error:  # delivered to every waiting caller, then keep serving
                self._fail_all(error)
                continue
            self._deliver(outputs)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            with self._streams_lock:
                stream = self._streams.get(output.request_id)
                if stream is not None and output.finished:
                    del self._streams[output.request_id]
            if stream is not None:
                stream._put(output)

    def _fail_all(self, error: Exception) -> None:
        with self._streams_lock:
            streams, self._streams = self._streams, {}
        for request_id, stream in streams.items():
            self._engine.abort(request_id)  # their "aborted" outputs are dropped by the next step
            stream._put(error)
