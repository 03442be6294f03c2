"""The capacity benchmark: how many streamed tokens/s the Python models around `tensorrt_llm` sustain, and at what CPU.

`run_capacity_bench` serves the bench's repository (repository.py: the packaged one with the GPU-pace stand-in in
place of the cpu engine, and the compared variants) and, per stream interval, runs rounds in which every path (the
ensemble as packaged, with batched postprocessing, the BLS, the floor, NVIDIA's models) takes its turn in a
tritonserver of its own through every concurrency point: a closed loop of streamed requests (fleet.py) with the
server's CPU read from /proc per process (tritonserver, each model's stub) at the two ends of each measured window,
and this process's own (the clients). Every streamed text is checked against the text the stand-in's tokens decode to.
The result is a JSON-ready dict; figures.py derives the rows and the summary, report.py the tables.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.capacity.fleet import Fleet, FleetTally
from bench.capacity.options import CapacityOptions
from bench.capacity.repository import BenchPath, bench_paths, ensemble_name, write_bench_repository
from bench.overhead.environment import load_module
from bench.overhead.rounds import group_cpu_by_process
from pipeline.load.serving import serving

Say = Callable[[str], None]


def run_capacity_bench(
    packaged: Path,
    batched_postprocessing_config: str,
    tokenizer_dir: Path,
    deploy: Any,
    options: CapacityOptions,
    *,
    progress: Say | None = None,
) -> dict[str, Any]:
    """Every stream interval, round and path, each path's round in a server of its own; a JSON-ready dict (`measurements`:
    one entry per interval, point, path and round)."""
    say = progress or (lambda line: None)
    started = _dt.datetime.now(_dt.timezone.utc)
    clock = time.monotonic()
    load_before = os.getloadavg()[0]
    measurements: list[dict[str, Any]] = []
    sittings = []
    for interval in options.stream_intervals:
        with tempfile.TemporaryDirectory(prefix="capacity-bench-") as scratch:
            repository = Path(scratch) / "model_repository"
            cycle = write_bench_repository(
                packaged,
                batched_postprocessing_config,
                repository,
                rate=options.rate,
                stream_interval=interval,
                tokenizer_dir=tokenizer_dir,
                nvidia_dir=options.nvidia_models,
            )
            expected = _expected_text(repository, tokenizer_dir, options, cycle)
            paths = bench_paths(ensemble_name(repository), nvidia_models=options.nvidia_models is not None, only=options.paths)
            say(f"stream_interval {interval}: {len(paths)} paths, stand-in at {options.rate} tokens/s per request")
            for number in range(options.rounds):  # each round: every path in turn, each in a server of its own
                for path in paths[number % len(paths) :] + paths[: number % len(paths)]:
                    with _Sitting(repository, deploy, options, say) as sitting:
                        sittings.append({"stream_interval": interval, "round": number, "path": path.name, "server_version": sitting.endpoints.server_version})
                        for concurrency in options.concurrency:
                            entry = sitting.measure(path, concurrency, interval, expected)
                            measurements.append({"stream_interval": interval, "concurrency": concurrency, "round": number, **entry})
                            if "stalled" in entry:  # the higher points would stall it again: this path's round ends here
                                say(f"  {path.name} stalled at {concurrency} streams: {entry['stalled']}")
                                break
                    say(f"  round {number + 1}/{options.rounds}: {path.name} done")
    return {
        "recipe": {
            "options": _recipe_options(options),
            "started": started.isoformat(timespec="seconds"),
            "wall_s": round(time.monotonic() - clock, 1),
            "load_average_1min": {"start": round(load_before, 2), "end": round(os.getloadavg()[0], 2)},
            "cpu_count": os.cpu_count(),
            "sittings": sittings,
        },
        "measurements": measurements,
    }


class _Sitting:
    """tritonserver on the bench's repository for one path's round: a server of its own, because Triton 2.51 can
    deadlock or corrupt its heap under GPU-pace streaming (BENCHMARKS.md, issue #34) and a path must not inherit
    what another left behind. A path that stalls it is recorded, not fatal."""

    def __init__(self, repository: Path, deploy: Any, options: CapacityOptions, say: Say) -> None:
        self._repository, self._deploy, self._options, self._say = repository, deploy, options, say
        self._stack = contextlib.ExitStack()
        self.endpoints: Any = None

    def __enter__(self) -> _Sitting:
        self.endpoints = self._stack.enter_context(
            serving(
                self._repository,
                self._deploy,
                model_name="ensemble",
                openai=False,
                startup_timeout=self._options.startup_timeout_s,
                say=lambda line: None,
                check_alive=False,
            )
        )
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    def measure(self, path: BenchPath, concurrency: int, interval: int, expected: dict[str, str]) -> dict[str, Any]:
        try:
            return _measure(self.endpoints, path, concurrency, interval, self._options, expected)
        except Exception as error:  # the server stalled or died: recorded with what its log says
            server = self.endpoints.server
            return {
                "path": path.name,
                "stubs": list(path.stubs),
                "stalled": f"{type(error).__name__}: {error}",
                "server_running": server.is_running(),
                "server_errors": server.error_lines()[:5],
            }


def _measure(endpoints, path: BenchPath, concurrency: int, interval: int, options: CapacityOptions, expected: dict[str, str]) -> dict[str, Any]:
    clocks: dict[str, tuple[dict[str, float], float]] = {}

    def on_window(end: str) -> None:
        clocks[end] = (group_cpu_by_process(endpoints.server.pid), time.process_time())

    fleet = Fleet(
        endpoints.grpc,
        path.model,
        prompt=options.prompt,
        max_tokens=options.max_tokens,
        stream_interval=interval,
        concurrency=concurrency,
        expected_text=expected[path.name],
        stall_s=options.stall_s,
    )
    try:
        tally = fleet.run(warmup_s=options.warmup_s, window_s=options.window_s, on_window=on_window)
    finally:
        fleet.close()
    (server_start, client_start), (server_end, client_end) = clocks["start"], clocks["end"]
    return {
        "path": path.name,
        "stubs": list(path.stubs),
        **_tally_fields(tally),
        "server_cpu_s": {label: round(seconds - server_start.get(label, 0.0), 3) for label, seconds in sorted(server_end.items())},
        "client_cpu_s": round(client_end - client_start, 3),
    }


def _tally_fields(tally: FleetTally) -> dict[str, Any]:
    return {
        "window_s": round(tally.window_s, 3),
        "tokens": tally.tokens,
        "responses": tally.responses,
        "gap_p50_ms": tally.p50_ms(tally.gaps),
        "ttft_p50_ms": tally.p50_ms(tally.ttfts),
        "completed": tally.completed,
        "texts_equal": tally.texts_equal,
        "responses_per_request": {str(count): requests for count, requests in sorted(tally.responses_per_request.items())},
        "errors": tally.errors[:5],
    }


def _expected_text(repository: Path, tokenizer_dir: Path, options: CapacityOptions, cycle: list[int]) -> dict[str, str]:
    """Each path's streamed text for the bench's prompt: what postprocessing's own function makes of the stand-in's
    tokens after the prompt (NVIDIA's postprocessing decodes each response alone: compared, not required)."""
    from bench.capacity.standin import gpu_pace

    hf_tokenizer = load_module(repository / "preprocessing" / "1" / "hf_tokenizer.py", "_capacity_bench_hf_tokenizer")
    detokenizer = load_module(repository / "postprocessing" / "1" / "incremental_detokenizer.py", "_capacity_bench_detokenizer")
    tokenizer = hf_tokenizer.HFTokenizer(tokenizer_dir)
    prompt = tokenizer.encode(options.prompt)
    output = list(gpu_pace.output_ids(prompt, options.max_tokens, cycle))
    text = detokenizer.text_delta(lambda ids: tokenizer.decode(ids), prompt[-detokenizer.CONTEXT_TOKENS :], output)
    return {"ensemble": text, "ensemble_batched": text, "bls": text, "floor": "", "floor_batched": "", "nvidia": text}


def _recipe_options(options: CapacityOptions) -> dict[str, Any]:
    return {
        "concurrency": list(options.concurrency),
        "stream_intervals": list(options.stream_intervals),
        "rate": options.rate,
        "max_tokens": options.max_tokens,
        "rounds": options.rounds,
        "warmup_s": options.warmup_s,
        "window_s": options.window_s,
        "nvidia_models": str(options.nvidia_models) if options.nvidia_models else None,
        "prompt": options.prompt,
        "paths": list(options.paths) or "all",
    }
