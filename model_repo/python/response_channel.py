"""One owner per response sender, so that cancellation is never polled after the final response.

Why: Triton's Python backend (2.51 and, as of its main branch, every later release) deletes a
request's `TRITONBACKEND_ResponseFactory` in the server process as soon as a response with the
FINAL flag is sent, while `response_sender.is_cancelled()` keeps asking the server about that
same factory: `ProcessIsRequestCancelled` calls `TRITONBACKEND_ResponseFactoryIsCancelled` on
the freed pointer and tritonserver dies with SIGSEGV. A model that polls cancellation from one
thread and answers from another must therefore order the two under one lock and stop polling
once the final response has gone. `ResponseChannel` is that lock and that flag;
`CancellationWatcher` is the one polling thread a model runs for all its open channels.

Pure Python (the sender is duck-typed), so the ordering is testable without Triton.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class ResponseChannel:
    """A response sender that is closed by its final response and never polled after it.

    `send` and `is_cancelled` may be called from any thread. After the final response (or
    after `send` raised while sending it) `send` returns False without sending and
    `is_cancelled` answers from what it last learnt, without asking the server.
    """

    def __init__(self, sender: Any, final_flag: int) -> None:
        self._sender = sender
        self._final_flag = final_flag
        self._lock = threading.Lock()
        self._closed = False
        self._cancelled = False

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, response: Any = None, *, final: bool = False) -> bool:
        """Send one response (the last one with `final`); False if the channel was already closed."""
        with self._lock:
            if self._closed:
                return False
            if final:
                # Closed before the send: if it raises half-way the factory may be gone already.
                self._closed = True
                self._sender.send(response, flags=self._final_flag)
            else:
                self._sender.send(response)
            return True

    def is_cancelled(self) -> bool:
        """Whether the client cancelled the request (asked of the server only while still open)."""
        with self._lock:
            if not self._closed and not self._cancelled:
                self._cancelled = bool(self._sender.is_cancelled())
            return self._cancelled


class BatchChannel:
    """The rows of one batched request (TensorRT-LLM splits a request of batch B into B
    generations) answering through one `ResponseChannel`: each row sends its own responses, and the
    FINAL flag goes out with the final response of the last row to finish. `fail` ends the whole
    request at once (its later responses, from any row, are dropped)."""

    def __init__(self, channel: ResponseChannel, rows: int) -> None:
        self._channel = channel
        self._open = set(range(rows))
        self._lock = threading.Lock()

    @property
    def channel(self) -> ResponseChannel:
        return self._channel

    def row_closed(self, row: int) -> bool:
        return row not in self._open or self._channel.closed

    def send(self, row: int, response: Any = None, *, final: bool = False) -> bool:
        with self._lock:
            if self.row_closed(row):
                return False
            if not final:
                return self._channel.send(response)
            self._open.discard(row)
            if not self._open:
                return self._channel.send(response, final=True)
            return True if response is None else self._channel.send(response)

    def fail(self, response: Any) -> bool:
        with self._lock:
            self._open.clear()
            return self._channel.send(response, final=True)


class CancellationWatcher:
    """A background thread that polls every watched channel every `period_s` seconds and calls
    its `on_cancel` once when the client has cancelled. Channels leave the watch list when they
    are closed, cancelled or `forget`-ten. `every_period`, if given, runs after each round (e.g.
    a metrics update); its errors go to `on_error` and never stop the polling."""

    def __init__(
        self,
        period_s: float,
        *,
        on_error: Callable[[str], None],
        every_period: Callable[[], None] | None = None,
        name: str = "cancellation-watcher",
    ) -> None:
        self._period_s = period_s
        self._on_error = on_error
        self._every_period = every_period
        self._watched: dict[int, tuple[ResponseChannel, Callable[[], None]]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> CancellationWatcher:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def watch(self, channel: ResponseChannel, on_cancel: Callable[[], None]) -> None:
        with self._lock:
            self._watched[id(channel)] = (channel, on_cancel)

    def forget(self, channel: ResponseChannel) -> None:
        with self._lock:
            self._watched.pop(id(channel), None)

    def poll_once(self) -> None:
        with self._lock:
            watched = list(self._watched.values())
        for channel, on_cancel in watched:
            try:
                cancelled = channel.is_cancelled()
            except Exception as error:  # a failed poll must not end the watcher
                self._on_error(f"cancellation check failed: {type(error).__name__}: {error}")
                continue
            if cancelled or channel.closed:
                self.forget(channel)
            if cancelled:
                try:
                    on_cancel()
                except Exception as error:
                    self._on_error(f"cancelling a request failed: {type(error).__name__}: {error}")

    def _run(self) -> None:
        while not self._stopping.wait(self._period_s):
            self.poll_once()
            if self._every_period is not None:
                try:
                    self._every_period()
                except Exception as error:
                    self._on_error(f"periodic task failed: {type(error).__name__}: {error}")


class WorkerThreads:
    """Runs each job on a thread of its own, reusing threads whose job has ended: a request served
    on its own thread (the BLS) costs a queue hand-off instead of a `Thread.start`, which waits
    until the new thread holds the GIL. Unbounded (a new thread when none is idle), daemon threads."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def run(self, job: Callable[..., None], *args: Any) -> None:
        with self._lock:
            reuse = self._idle > 0
            if reuse:
                self._idle -= 1  # that idle thread takes exactly one job off the queue
        if reuse:
            self._jobs.put((job, args))
        else:
            # The first job goes in a list the thread empties: Thread keeps its args while its target runs (forever here).
            threading.Thread(target=self._work, args=([(job, args)],), name=self._name, daemon=True).start()

    def _work(self, first: list[tuple[Callable[..., None], tuple]]) -> None:
        item = first.pop()
        while True:
            job, args = item
            try:
                job(*args)
            except Exception:  # a job reports its own errors; the thread must survive it
                pass
            del job, args, item  # an idle thread must not keep its last request (and its response sender) alive
            with self._lock:
                self._idle += 1
            item = self._jobs.get()
