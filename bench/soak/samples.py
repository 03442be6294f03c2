"""Memory, descriptors and threads of every process that serves the soak, sampled at a fixed interval while it runs.

A process is the tritonserver, each Python-backend stub (named by its model: the stub's first argument is the
model's `model.py` path) and this process, which runs the OpenAI front end's thread and the clients. A sample
reads /proc only: RSS from /proc/<pid>/stat, split into anonymous and shared-memory pages by /proc/<pid>/status
(RssAnon, RssShmem: the Python backend's stubs and the server share their tensors through a /dev/shm region
that both count), descriptors from /proc/<pid>/fd, threads from /proc/<pid>/task. The trend of a series is its
least-squares slope over the last two thirds of the run, so that a warm-up step (allocators and caches filling in
the first minutes) does not read as a leak, and a leak does.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.serve import process

_PROC = Path("/proc")
SELF_NAME = "bench (front end + clients)"
WARM_UP_FRACTION = 1 / 3  # the share of the samples a trend leaves out
MIN_TREND_SAMPLES = 3


@dataclass(frozen=True)
class ProcessSample:
    name: str  # "tritonserver", "stub <model>", SELF_NAME
    pid: int
    rss_mb: float
    fds: int | None  # None: not readable
    threads: int | None
    anon_mb: float | None = None  # RssAnon: the process's own heap
    shmem_mb: float | None = None  # RssShmem: touched pages of shared memory (the Python backend's region)


@dataclass(frozen=True)
class Sample:
    t_s: float  # seconds since the sampler started
    processes: tuple[ProcessSample, ...]

    def by_name(self) -> dict[str, ProcessSample]:
        return {p.name: p for p in self.processes}


@dataclass(frozen=True)
class Trend:
    name: str
    samples: int
    rss_first_mb: float
    rss_last_mb: float
    rss_slope_mb_per_min: float | None  # over the last two thirds; None: too few samples
    anon_slope_mb_per_min: float | None
    shmem_slope_mb_per_min: float | None
    fds_first: int | None
    fds_last: int | None
    threads_first: int | None
    threads_last: int | None


def _count(path: Path) -> int | None:
    try:
        return sum(1 for _ in path.iterdir())
    except OSError:
        return None


def _stub_model(pid: int) -> str:
    """The model a stub serves: its first argument is <repository>/<model>/<version>/model.py."""
    try:
        argv = (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid {pid}"
    if len(argv) > 1 and argv[1]:
        parts = Path(argv[1].decode(errors="replace")).parts
        if len(parts) >= 3:
            return parts[-3]
    return f"pid {pid}"


def _status_mb(base: Path) -> dict[str, float]:
    """RssAnon and RssShmem of /proc/<pid>/status in MB (absent keys: not there)."""
    try:
        text = (base / "status").read_text()
    except OSError:
        return {}
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssShmem"):
            found[key] = round(int(value.split()[0]) / 1024, 2)  # kB
    return found


def _sample_one(name: str, pid: int, rss_bytes: int) -> ProcessSample:
    base = _PROC / str(pid)
    status = _status_mb(base)
    return ProcessSample(name, pid, round(rss_bytes / 2**20, 2), _count(base / "fd"), _count(base / "task"), status.get("RssAnon"), status.get("RssShmem"))


def sample_processes(server_pid: int) -> tuple[ProcessSample, ...]:
    """One sample of the server's process group and of this process."""
    found = []
    for member in process.group_members(server_pid):
        name = "tritonserver" if member.pid == server_pid else f"stub {_stub_model(member.pid)}" if member.is_stub else f"{member.comm} {member.pid}"
        found.append(_sample_one(name, member.pid, member.rss_bytes))
    me = process.read_process(os.getpid())
    if me is not None:
        found.append(_sample_one(SELF_NAME, me.pid, me.rss_bytes))
    return tuple(found)


class Sampler:
    """Samples `read()` every `interval_s` seconds on a daemon thread between `start()` and `stop()`."""

    def __init__(self, read: Callable[[], tuple[ProcessSample, ...]], interval_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        if not interval_s > 0:
            raise ValueError(f"the sampling interval must be > 0 s, got {interval_s}")
        self._read, self._interval_s, self._clock = read, interval_s, clock
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)
        self._started = 0.0

    def start(self) -> Sampler:
        self._started = self._clock()
        self._take()
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(self._interval_s + 10)
        self._take()
        return self.samples

    @property
    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    def _take(self) -> None:
        sample = Sample(round(self._clock() - self._started, 2), self._read())
        with self._lock:
            self._samples.append(sample)

    def _run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            self._take()


def slope_per_min(points: Sequence[tuple[float, float]]) -> float | None:
    """The least-squares slope (units per minute) of (t_s, value) points after the warm-up share; None if too few."""
    kept = list(points)[int(len(points) * WARM_UP_FRACTION) :]
    if len(kept) < MIN_TREND_SAMPLES:
        return None
    mean_t = sum(t for t, _ in kept) / len(kept)
    mean_v = sum(v for _, v in kept) / len(kept)
    spread = sum((t - mean_t) ** 2 for t, _ in kept)
    if spread == 0:
        return None
    return round(60 * sum((t - mean_t) * (v - mean_v) for t, v in kept) / spread, 3)


def trends(samples: Sequence[Sample]) -> list[Trend]:
    """Per process name, in the order first seen: its RSS slope and first/last descriptors and threads."""
    names = list(dict.fromkeys(p.name for s in samples for p in s.processes))
    out = []
    for name in names:
        series = [(s.t_s, s.by_name()[name]) for s in samples if name in s.by_name()]
        first, last = series[0][1], series[-1][1]
        out.append(
            Trend(
                name=name,
                samples=len(series),
                rss_first_mb=first.rss_mb,
                rss_last_mb=last.rss_mb,
                rss_slope_mb_per_min=slope_per_min([(t, p.rss_mb) for t, p in series]),
                anon_slope_mb_per_min=slope_per_min([(t, p.anon_mb) for t, p in series if p.anon_mb is not None]),
                shmem_slope_mb_per_min=slope_per_min([(t, p.shmem_mb) for t, p in series if p.shmem_mb is not None]),
                fds_first=first.fds,
                fds_last=last.fds,
                threads_first=first.threads,
                threads_last=last.threads,
            )
        )
    return out


def vanished(samples: Sequence[Sample]) -> list[str]:
    """Processes seen in one sample and gone from every later one before the last (a stub the OOM killer took, a
    crashed server), each named with its pid, its last RSS and when it was last seen."""
    if not samples:
        return []
    final = {p.pid for p in samples[-1].processes}
    last_seen: dict[int, tuple[float, ProcessSample]] = {}
    for sample in samples:
        for p in sample.processes:
            last_seen[p.pid] = (sample.t_s, p)
    return [
        f"{p.name} (pid {pid}) went away after {t:.0f} s at {p.rss_mb:.0f} MB RSS (a crash or the kernel's OOM killer: see dmesg)"
        for pid, (t, p) in sorted(last_seen.items())
        if pid not in final
    ]


def samples_dict(samples: Sequence[Sample]) -> list[dict]:
    return [asdict(s) for s in samples]
