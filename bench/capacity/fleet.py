"""The capacity bench's clients: `concurrency` streamed requests kept in flight over a few gRPC streams.

Closed loop: every finished request is followed at once by the next on the same stream, so the server always
holds `concurrency` streams; many requests share one gRPC stream (Triton's bidirectional stream carries them
side by side, told apart by request id), which keeps this process's own CPU per token low (one callback thread
per stream, no thread per request). A run warms up, then measures a window (the callbacks count the tokens that
arrive in it; `on_window` marks its two ends for the caller's CPU clocks), then stops sending and waits for the
requests in flight. A server that stops answering raises `FleetStalled` after `stall_s`, never hangs.

Tokens per response are known, not parsed: the stand-in answers a streamed request of T tokens with the first
token alone, then `stream_interval` tokens per response, the rest with the last (gpu_pace.next_chunk), and the
ensemble and the BLS send one response per response of `tensorrt_llm`.
"""

from __future__ import annotations

import statistics
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.errors import StageError

STREAMS = 4


class FleetStalled(StageError):
    """The server stopped answering a measured path."""


@dataclass
class FleetTally:
    """What one run measured inside its window (and how its requests ended)."""

    window_s: float = 0.0
    tokens: int = 0
    responses: int = 0
    gaps: list[float] = field(default_factory=list)  # s between consecutive responses of a request
    ttfts: list[float] = field(default_factory=list)  # s from sending to the first response
    completed: int = 0
    texts_equal: int = 0
    errors: list[str] = field(default_factory=list)
    # the whole run's completed requests by how many responses with a text each got (known in advance from the
    # stand-in's pattern: the first token alone, then stream_interval tokens per response)
    responses_per_request: dict[int, int] = field(default_factory=dict)

    def p50_ms(self, values: list[float]) -> float | None:
        return round(statistics.median(values) * 1000.0, 2) if values else None


@dataclass
class _Request:
    stream: int
    sent: float
    responses: int = 0
    last: float = 0.0
    parts: list[str] = field(default_factory=list)


def chunk_tokens(index: int, max_tokens: int, stream_interval: int) -> int:
    """Tokens carried by the `index`-th streamed response of a `max_tokens` request (the stand-in's pattern)."""
    if index == 0:
        return 1
    before = 1 + (index - 1) * stream_interval
    return max(0, min(stream_interval, max_tokens - before))


class Fleet:
    def __init__(
        self,
        url: str,
        model: str,
        *,
        prompt: str,
        max_tokens: int,
        stream_interval: int,
        concurrency: int,
        expected_text: str,
        stall_s: float = 60.0,
    ) -> None:
        import numpy as np
        import tritonclient.grpc as grpcclient

        self.model, self.max_tokens, self.interval, self.concurrency = model, max_tokens, stream_interval, concurrency
        self.expected_text, self.stall_s = expected_text, stall_s
        self._lock = threading.Lock()
        self._requests: dict[str, _Request] = {}
        self._sending = False
        self._closed = False
        self._window: FleetTally | None = None
        self._last_arrival = time.monotonic()
        self.tally = FleetTally()
        self._inputs = []
        for name, array, datatype in (
            ("text_input", np.array([[prompt.encode("utf-8")]], dtype=np.object_), "BYTES"),
            ("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
            ("stream", np.array([[True]], dtype=np.bool_), "BOOL"),
        ):
            tensor = grpcclient.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            self._inputs.append(tensor)
        self._outputs = [grpcclient.InferRequestedOutput("text_output")]
        self._clients = [grpcclient.InferenceServerClient(url) for _ in range(min(STREAMS, concurrency))]
        for index, client in enumerate(self._clients):
            client.start_stream(callback=lambda result, error, index=index: self._on_response(index, result, error))

    def run(self, *, warmup_s: float, window_s: float, on_window: Callable[[str], None]) -> FleetTally:
        """Keep `concurrency` requests in flight; measure `window_s` seconds after `warmup_s`; drain."""
        with self._lock:
            self._sending = True
            starts = [self._start(index % len(self._clients)) for index in range(self.concurrency)]
        for start in starts:
            start()
        self._wait(warmup_s)
        on_window("start")
        with self._lock:
            self._window = self.tally
            opened = time.monotonic()
        self._wait(window_s)
        with self._lock:
            self._window = None
            self.tally.window_s = time.monotonic() - opened
            self._sending = False
        on_window("end")
        while True:
            with self._lock:
                if not self._requests:
                    break
            self._wait(0.05)
        return self.tally

    def close(self) -> None:
        with self._lock:
            self._closed = True  # what the streams report while closing is not the server's answer
        for client in self._clients:
            try:
                client.stop_stream(cancel_requests=bool(self._requests))
            finally:
                client.close()

    def _wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.25))
            with self._lock:
                quiet = time.monotonic() - self._last_arrival
                waiting = len(self._requests)
            if waiting and quiet > self.stall_s:
                raise FleetStalled(
                    f"{self.model}: no response for {quiet:.0f} s with {waiting} request(s) in flight",
                    hint="the server deadlocked or died (Triton 2.51 under GPU-pace streaming: BENCHMARKS.md, issue #34)",
                )

    def _start(self, stream: int) -> Callable[[], None]:
        """Register a new request (lock held) and return the call that sends it (made outside the lock)."""
        request_id = uuid.uuid4().hex
        self._requests[request_id] = _Request(stream, time.monotonic())
        return lambda: self._clients[stream].async_stream_infer(
            self.model, self._inputs, request_id=request_id, outputs=self._outputs, enable_empty_final_response=True
        )

    def _on_response(self, stream: int, result, error) -> None:
        now = time.monotonic()
        follow_up = None
        with self._lock:
            self._last_arrival = now
            if self._closed:
                return
            if error is not None:
                self.tally.errors.append(str(error))
                return
            response = result.get_response()
            request = self._requests.get(response.id)
            if request is None:
                self.tally.errors.append(f"a response for unknown request {response.id!r}")
                return
            text = _text_output(response)
            window = self._window
            if text is not None:
                if window is not None:
                    window.tokens += chunk_tokens(request.responses, self.max_tokens, self.interval)
                    window.responses += 1
                    (window.ttfts if request.responses == 0 else window.gaps).append(now - (request.sent if request.responses == 0 else request.last))
                request.parts.append(text)
                request.responses += 1
                request.last = now
            if response.parameters["triton_final_response"].bool_param:
                del self._requests[response.id]
                self.tally.completed += 1
                self.tally.texts_equal += "".join(request.parts) == self.expected_text
                counts = self.tally.responses_per_request
                counts[request.responses] = counts.get(request.responses, 0) + 1
                if self._sending:
                    follow_up = self._start(stream)
        if follow_up is not None:
            follow_up()


def _text_output(response) -> str | None:
    """text_output's first element from the raw BYTES contents (4-byte length, then the bytes), or None."""
    for index, output in enumerate(response.outputs):
        if output.name == "text_output":
            raw = response.raw_output_contents[index]
            (length,) = struct.unpack_from("<I", raw, 0)
            return raw[4 : 4 + length].decode("utf-8")
    return None
