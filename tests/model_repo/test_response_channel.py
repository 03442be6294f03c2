"""`ResponseChannel` / `CancellationWatcher` (model_repo/python/response_channel.py): cancellation is
never polled after a request's final response, from any thread, in any interleaving.

The fake sender mimics Triton's Python backend: once a FINAL response is sent, the request's
response factory is gone, and asking `is_cancelled()` about it is a use-after-free (tritonserver
dies with SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled); here it raises instead.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path

import pytest

MODEL_CODE = Path(__file__).resolve().parents[2] / "model_repo" / "python"
FINAL = 1


class FreedFactory(AssertionError):
    pass


class FakeSender:
    """A response sender whose factory is freed by the final response, with widened race windows."""

    def __init__(self, *, cancelled_after: float | None = None, jitter: float = 0.0) -> None:
        self.sent: list[tuple[object, int]] = []
        self.polls = 0
        self.freed = False
        self._cancel_at = None if cancelled_after is None else time.monotonic() + cancelled_after
        self._jitter = jitter
        self._rng = random.Random(0)

    def _pause(self) -> None:
        if self._jitter:
            time.sleep(self._rng.random() * self._jitter)

    def send(self, response=None, flags=0):
        if self.freed:
            raise FreedFactory("send after the final response")
        self._pause()
        self.sent.append((response, flags))
        if flags == FINAL:
            self.freed = True

    def is_cancelled(self):
        if self.freed:
            raise FreedFactory("is_cancelled() after the final response: the response factory was freed")
        self.polls += 1
        self._pause()
        if self.freed:  # freed while the server was being asked: the same crash
            raise FreedFactory("the final response was sent while is_cancelled() was in flight")
        return self._cancel_at is not None and time.monotonic() >= self._cancel_at


@pytest.fixture
def channel_module(monkeypatch):
    monkeypatch.syspath_prepend(str(MODEL_CODE))
    import response_channel

    yield response_channel
    sys.modules.pop("response_channel", None)


def test_no_poll_and_no_send_after_the_final_response(channel_module):
    sender = FakeSender()
    channel = channel_module.ResponseChannel(sender, FINAL)
    assert channel.send("a") and not channel.closed
    assert channel.is_cancelled() is False
    assert channel.send("b", final=True) and channel.closed
    assert channel.is_cancelled() is False  # answered without asking the freed factory
    assert channel.send("late", final=True) is False
    assert channel.send("late") is False
    assert sender.sent == [("a", 0), ("b", FINAL)]


def test_a_cancellation_seen_once_is_remembered_after_close(channel_module):
    sender = FakeSender(cancelled_after=0.0)
    channel = channel_module.ResponseChannel(sender, FINAL)
    assert channel.is_cancelled() is True
    channel.send("cancelled", final=True)
    assert channel.is_cancelled() is True
    assert sender.polls == 1


def test_a_final_send_that_raises_still_closes_the_channel(channel_module):
    class Failing(FakeSender):
        def send(self, response=None, flags=0):
            if flags == FINAL:
                self.freed = True
                raise RuntimeError("stub lost its parent")
            super().send(response, flags)

    sender = Failing()
    channel = channel_module.ResponseChannel(sender, FINAL)
    with pytest.raises(RuntimeError):
        channel.send("x", final=True)
    assert channel.closed and channel.is_cancelled() is False


@pytest.mark.parametrize("seed", range(4))
def test_the_watcher_and_a_relay_thread_never_race(channel_module, seed):
    """Many requests, each answered by its own thread while one watcher polls them all: the
    interleavings that crashed tritonserver (poll picked, final sent, poll made) never happen."""
    errors: list[BaseException] = []
    watcher = channel_module.CancellationWatcher(0.0005, on_error=lambda message: errors.append(AssertionError(message)))
    watcher.start()
    rng = random.Random(seed)
    senders, cancelled = [], []

    def relay(channel, responses):
        try:
            for index in range(responses):
                channel.send(index, final=index == responses - 1)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = []
    for request in range(60):
        sender = FakeSender(cancelled_after=rng.choice([None, 0.0, 0.002]), jitter=0.0005)
        channel = channel_module.ResponseChannel(sender, FINAL)
        watcher.watch(channel, lambda request=request: cancelled.append(request))
        senders.append(sender)
        threads.append(threading.Thread(target=relay, args=(channel, rng.randint(1, 6))))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(0.01)
    watcher.stop()
    assert not errors, errors[:3]
    assert all(sender.sent[-1][1] == FINAL for sender in senders)
    assert len(cancelled) == len(set(cancelled))  # on_cancel at most once per request


def test_on_cancel_runs_once_and_the_channel_leaves_the_watch_list(channel_module):
    sender = FakeSender(cancelled_after=0.0)
    channel = channel_module.ResponseChannel(sender, FINAL)
    calls = []
    watcher = channel_module.CancellationWatcher(1.0, on_error=calls.append)
    watcher.watch(channel, lambda: calls.append("cancel"))
    watcher.poll_once()
    watcher.poll_once()
    assert calls == ["cancel"] and sender.polls == 1


def test_a_failing_periodic_task_does_not_stop_the_polling(channel_module):
    messages: list[str] = []
    ticks = []

    def every_period():
        ticks.append(1)
        raise RuntimeError("metrics down")

    watcher = channel_module.CancellationWatcher(0.001, on_error=messages.append, every_period=every_period).start()
    deadline = time.monotonic() + 60  # a hang guard: a 1 ms period ticks 3 times at once unless the machine stalls it
    while len(ticks) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    watcher.stop()
    assert len(ticks) >= 3 and all("metrics down" in message for message in messages)


def test_a_batch_sends_its_final_flag_with_the_last_row_to_finish(channel_module):
    sender = FakeSender(jitter=0.001)
    batch = channel_module.BatchChannel(channel_module.ResponseChannel(sender, FINAL), rows=3)

    def row(index):
        for step in range(5):
            assert batch.send(index, f"{index}.{step}")
        batch.send(index, f"{index}.last", final=True)

    threads = [threading.Thread(target=row, args=(index,)) for index in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    flags = [flag for _, flag in sender.sent]
    assert len(sender.sent) == 18 and flags[-1] == FINAL and flags.count(FINAL) == 1
    assert all(batch.row_closed(index) for index in range(3)) and batch.channel.closed
    assert batch.send(0, "late") is False


def test_a_failed_batch_ends_at_once_and_drops_the_other_rows(channel_module):
    sender = FakeSender()
    batch = channel_module.BatchChannel(channel_module.ResponseChannel(sender, FINAL), rows=2)
    assert batch.send(0, "0.a") and batch.send(1, None, final=True)  # row 1 done, nothing sent
    assert batch.fail("error") and batch.row_closed(0)
    assert batch.send(0, "0.b", final=True) is False
    assert sender.sent == [("0.a", 0), ("error", FINAL)]


def test_worker_threads_run_every_job_and_reuse_an_idle_thread(channel_module):
    workers = channel_module.WorkerThreads("test-worker")
    ran: list[tuple[int, int]] = []
    done = threading.Semaphore(0)

    def job(number: int) -> None:
        ran.append((number, threading.get_ident()))
        done.release()

    workers.run(job, 0)
    assert done.acquire(timeout=5)
    deadline = time.monotonic() + 5
    while workers._idle == 0 and time.monotonic() < deadline:  # the thread goes idle after its job
        time.sleep(0.001)
    workers.run(job, 1)  # taken by the idle thread, not a new one
    assert done.acquire(timeout=5)
    assert [number for number, _ in ran] == [0, 1] and ran[0][1] == ran[1][1]

    gate = threading.Event()
    workers.run(lambda: gate.wait(5))  # busy: the next job needs a thread of its own
    workers.run(job, 2)
    assert done.acquire(timeout=5)
    gate.set()
    workers.run(lambda: 1 / 0)  # a failing job does not end its thread
    workers.run(job, 3)
    assert done.acquire(timeout=5) and [number for number, _ in ran] == [0, 1, 2, 3]


def test_an_idle_worker_thread_keeps_nothing_of_its_jobs(channel_module):
    """The BLS hands each request (and its response sender) to a worker: once served, no thread may keep it alive,
    neither the new thread's own arguments (Thread holds them while its target runs, i.e. forever) nor an idle loop."""
    import gc
    import weakref

    class Request:
        pass

    workers = channel_module.WorkerThreads("test-worker")
    done = threading.Semaphore(0)
    first, second = Request(), Request()
    refs = [weakref.ref(first), weakref.ref(second)]
    workers.run(lambda request: done.release(), first)
    assert done.acquire(timeout=5)
    deadline = time.monotonic() + 5
    while workers._idle == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    workers.run(lambda request: done.release(), second)  # the idle thread's second job
    assert done.acquire(timeout=5)
    del first, second
    deadline = time.monotonic() + 5
    while any(ref() is not None for ref in refs) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert [ref() for ref in refs] == [None, None]
