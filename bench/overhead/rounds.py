"""How the overhead benchmark times a round of one path: wall time, the server's CPU by process
(/proc) and Triton's per-model statistics, summed over interleaved rounds (`run_part`)."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.overhead import model_stats
from bench.overhead.paths import MeasuredPath, Sample

_CLK_TCK = os.sysconf("SC_CLK_TCK")


class _Tally:
    """One path's samples and clocks, summed over its rounds."""

    def __init__(self) -> None:
        self.reconnects = 0
        self.samples: list[Sample] = []
        self.round_wall: list[float] = []
        self.server_cpu = 0.0
        self.client_cpu = 0.0
        self.server_cpu_by_process: dict[str, float] = {}  # tritonserver / each model's stub → CPU s
        self.model_stats: model_stats.Snapshot = {}  # per-model counters summed over the rounds


def _run_round(workers: list, count: int, tally: _Tally, server_pgid: int | None, stats_url: str | None = None) -> None:
    """`_timed_round` between two snapshots of Triton's per-model statistics (taken outside its clocks)."""
    if not stats_url:
        _timed_round(workers, count, tally, server_pgid)
        return
    before = model_stats.snapshot(stats_url)
    _timed_round(workers, count, tally, server_pgid)
    model_stats.add_difference(tally.model_stats, before, model_stats.settled_snapshot(stats_url))


def _timed_round(workers: list, count: int, tally: _Tally, server_pgid: int | None) -> None:
    """`count` requests spread over the workers (closed loop: one request in flight per worker)."""
    server_before = group_cpu_by_process(server_pgid) if server_pgid else {}
    client_before = time.process_time()
    started = time.perf_counter()
    if len(workers) == 1:
        samples = [workers[0].request() for _ in range(count)]
    else:
        errors: list[BaseException] = []
        samples, lock = [], threading.Lock()
        remaining = [count]

        def drive(worker) -> None:
            while True:
                with lock:
                    if remaining[0] == 0 or errors:
                        return
                    remaining[0] -= 1
                try:
                    sample = worker.request()
                except BaseException as error:  # re-raised in the calling thread
                    with lock:
                        errors.append(error)
                    return
                with lock:
                    samples.append(sample)

        threads = [threading.Thread(target=drive, args=(worker,), daemon=True) for worker in workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
    tally.round_wall.append(time.perf_counter() - started)
    tally.client_cpu += time.process_time() - client_before
    if server_pgid:
        for label, seconds in group_cpu_by_process(server_pgid).items():
            spent = seconds - server_before.get(label, 0.0)
            tally.server_cpu += spent
            tally.server_cpu_by_process[label] = tally.server_cpu_by_process.get(label, 0.0) + spent
    tally.samples.extend(samples)


def group_cpu_by_process(pgid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each live process of the group, by what it runs: the
    Python stub of a model by that model's name, anything else (tritonserver: its core, the
    ensemble scheduler, the HTTP/gRPC front ends) by its program name."""
    seconds: dict[str, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) != pgid:  # fields after the name: state, ppid, pgrp, ..., utime (11), stime (12)
                continue
            with open(f"/proc/{entry.name}/cmdline", "rb") as cmdline:
                label = _process_label(cmdline.read().split(b"\0"))
        except OSError:
            continue
        seconds[label] = seconds.get(label, 0.0) + (int(fields[11]) + int(fields[12])) / _CLK_TCK
    return seconds


def _process_label(argv: list[bytes]) -> str:
    """`triton_python_backend_stub <repo>/<model>/<version>/model.py ...` → `<model>`."""
    words = [word.decode(errors="replace") for word in argv if word]
    if not words:
        return "?"
    program = Path(words[0]).name
    if "python_backend_stub" in program and len(words) > 1 and words[1].endswith(".py"):
        return Path(words[1]).parent.parent.name
    return program


def run_part(
    paths,
    make_workers: Callable[[MeasuredPath], list],
    *,
    requests: int,
    warmup: int,
    rounds: int,
    server_pgid: int,
    say: Callable[[str], None],
    title: str,
    all_workers: list,
    stats_url: str | None = None,
) -> dict[str, _Tally]:
    workers = {}
    for path in paths:
        workers[path.name] = make_workers(path)
        all_workers.extend(workers[path.name])
    tallies = {path.name: _Tally() for path in paths}
    for path in paths:  # warm-up, not counted
        _run_round(workers[path.name], warmup, _Tally(), None)
    per_round = _split(requests, rounds)
    for number, count in enumerate(per_round):
        order = list(paths[number % len(paths) :]) + list(paths[: number % len(paths)])
        for path in order:
            served = path.kind in ("http", "grpc")
            _run_round(workers[path.name], count, tallies[path.name], server_pgid if served else None, stats_url if served else None)
        say(f"{title}: round {number + 1}/{len(per_round)} done ({count} requests per path)")
    for path in paths:
        tallies[path.name].reconnects = sum(getattr(worker, "reconnects", 0) for worker in workers[path.name])
        for worker in workers[path.name]:
            worker.close()
            all_workers.remove(worker)
    return tallies


def _split(total: int, rounds: int) -> list[int]:
    rounds = max(1, min(rounds, total))
    return [total // rounds + (1 if index < total % rounds else 0) for index in range(rounds)]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def ms_summary(values: list[float]) -> dict[str, float]:
    values = [value * 1000.0 for value in values]
    return {
        "p50": round(_percentile(values, 50), 3),
        "p90": round(_percentile(values, 90), 3),
        "p99": round(_percentile(values, 99), 3),
        "mean": round(statistics.fmean(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def result_row(path: MeasuredPath, tally: _Tally, callers: int) -> dict[str, Any]:
    count = len(tally.samples)
    wall = sum(tally.round_wall)
    server = path.kind in ("http", "grpc")
    return {
        "path": path.name,
        "label": path.label,
        "model": path.model,
        "protocol": {"http": "http_generate", "grpc": "grpc_stream"}.get(path.kind, "in_process"),
        "stream": path.stream,
        "callers": callers,
        "requests": count,
        "wall_s": round(wall, 4),
        "rounds_wall_s": [round(value, 4) for value in tally.round_wall],
        "requests_per_s": round(count / wall, 3),
        "latency_ms": ms_summary([sample.latency for sample in tally.samples]),
        "server_cpu_ms_per_request": round(tally.server_cpu * 1000.0 / count, 3) if server else None,
        "client_cpu_ms_per_request": round(tally.client_cpu * 1000.0 / count, 3),
        "total_cpu_ms_per_request": round((tally.server_cpu + tally.client_cpu) * 1000.0 / count, 3),
        "responses_per_request": round(statistics.fmean(sample.responses for sample in tally.samples), 3),
        "http_reconnects": tally.reconnects if path.kind == "http" else None,
        "server_cpu_ms_per_request_by_process": {label: round(seconds * 1000.0 / count, 3) for label, seconds in sorted(tally.server_cpu_by_process.items())}
        if server
        else None,
        "model_stats_per_request": model_stats.per_request(tally.model_stats, count) if tally.model_stats else None,
    }
