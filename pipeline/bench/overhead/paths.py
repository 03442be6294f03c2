"""The overhead benchmark's measured paths (HTTP, gRPC, in-process, EngineLoop) and how a round is timed."""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import queue
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.bench.overhead.environment import load_module

_RESPONSE_TIMEOUT_S = 120.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- paths ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MeasuredPath:
    name: str  # JSON key
    label: str  # table row
    kind: str  # "inprocess" | "loop" | "http" | "grpc"
    model: str | None = None
    stream: bool = False


SINGLE_TOKEN_PATHS = (
    MeasuredPath("inprocess", "in-process: tokenize + `engine.generate` + detokenize", "inprocess"),
    MeasuredPath("inprocess_loop", "in-process: `EngineLoop` submit (step thread) + detokenize", "loop"),
    MeasuredPath("http_ensemble", "ensemble, HTTP `/generate`", "http", "ensemble"),
    MeasuredPath("grpc_ensemble", "ensemble, gRPC stream, `stream=false`", "grpc", "ensemble"),
    MeasuredPath("grpc_ensemble_streamed", "ensemble, gRPC stream, `stream=true`", "grpc", "ensemble", True),
    MeasuredPath("http_bls", "BLS, HTTP `/generate`", "http", "tensorrt_llm_bls"),
    MeasuredPath("grpc_bls", "BLS, gRPC stream, `stream=false`", "grpc", "tensorrt_llm_bls"),
    MeasuredPath("grpc_bls_streamed", "BLS, gRPC stream, `stream=true`", "grpc", "tensorrt_llm_bls", True),
)
STREAM_PATHS = (
    MeasuredPath("inprocess", "in-process: `engine.generate` N tokens + detokenize", "inprocess"),
    MeasuredPath("inprocess_loop_streamed", "in-process: `EngineLoop`, streamed, incremental detokenize", "loop", None, True),
    MeasuredPath("grpc_ensemble", "ensemble, gRPC, `stream=false`", "grpc", "ensemble"),
    MeasuredPath("grpc_ensemble_streamed", "ensemble, gRPC, `stream=true`", "grpc", "ensemble", True),
    MeasuredPath("grpc_bls", "BLS, gRPC, `stream=false`", "grpc", "tensorrt_llm_bls"),
    MeasuredPath("grpc_bls_streamed", "BLS, gRPC, `stream=true`", "grpc", "tensorrt_llm_bls", True),
)
# The 1-token row each N-token row is compared with (marginal cost of the other N - 1 tokens).
ONE_TOKEN_OF = {
    "inprocess": "inprocess",
    "inprocess_loop_streamed": "inprocess_loop",
    "grpc_ensemble": "grpc_ensemble",
    "grpc_ensemble_streamed": "grpc_ensemble_streamed",
    "grpc_bls": "grpc_bls",
    "grpc_bls_streamed": "grpc_bls_streamed",
}


@dataclasses.dataclass
class _Sample:
    latency: float  # s, request sent → final response
    text: str
    responses: int  # responses carrying text (1 unless streamed)
    ttft: float | None = None  # s, request sent → first text response
    gaps: tuple[float, ...] = ()  # s, between consecutive text responses


# -- the workers: one per caller, reused across rounds -----------------------------------------
class Tokenizer:
    """The served repository's own tokenizer and detokenizer code, loaded in this process."""

    def __init__(self, repo: Path, tokenizer_dir: Path) -> None:
        hf_tokenizer = load_module(repo / "preprocessing" / "1" / "hf_tokenizer.py", "_serve_bench_hf_tokenizer")
        detok = load_module(repo / "postprocessing" / "1" / "incremental_detokenizer.py", "_serve_bench_incremental_detokenizer")
        self.tokenizer = hf_tokenizer.HFTokenizer(tokenizer_dir)
        self.text_delta = detok.text_delta
        self.context_tokens = detok.CONTEXT_TOKENS
        self.IncrementalDetokenizer = detok.IncrementalDetokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def delta(self, prompt_ids: list[int], new_ids: list[int]) -> str:
        return self.text_delta(self.tokenizer.decode, prompt_ids[-self.context_tokens :], new_ids)


class InProcess:
    def __init__(self, engine, tok: Tokenizer, prompt: str, max_tokens: int) -> None:
        from refengine import SamplingParams

        self.engine, self.tok, self.prompt = engine, tok, prompt
        self.params = SamplingParams(max_tokens=max_tokens, temperature=0.0, end_id=tok.tokenizer.eos_id)

    def request(self) -> _Sample:
        start = time.perf_counter()
        ids = self.tok.encode(self.prompt)
        [output] = self.engine.generate([ids], self.params)
        text = self.tok.delta(ids, list(output.outputs[0].token_ids))
        return _Sample(time.perf_counter() - start, text, 1)

    def close(self) -> None:
        pass


class InProcessLoop:
    def __init__(self, loop, tok: Tokenizer, prompt: str, max_tokens: int, stream: bool) -> None:
        from refengine import SamplingParams

        self.loop, self.tok, self.prompt, self.stream = loop, tok, prompt, stream
        self.params = SamplingParams(max_tokens=max_tokens, temperature=0.0, end_id=tok.tokenizer.eos_id)

    def request(self) -> _Sample:
        start = time.perf_counter()
        ids = self.tok.encode(self.prompt)
        stream = self.loop.submit(ids, self.params)
        if not self.stream:
            output = stream.result()
            text = self.tok.delta(ids, list(output.outputs[0].token_ids))
            return _Sample(time.perf_counter() - start, text, 1)
        detok = self.tok.IncrementalDetokenizer(self.tok.tokenizer.decode, ids)
        times, parts = [], []
        for output in stream:
            new = list(output.outputs[0].new_token_ids)
            if new:
                parts.append(detok.push(new))
                times.append(time.perf_counter())
        return _Sample(times[-1] - start, "".join(parts), len(times), times[0] - start, _gaps(times))

    def close(self) -> None:
        pass


class HttpGenerate:
    """POST /v2/models/<model>/generate on one keep-alive connection."""

    def __init__(self, host: str, port: int, model: str, prompt: str, max_tokens: int) -> None:
        self.host, self.port = host, port
        self.connection = http.client.HTTPConnection(host, port, timeout=_RESPONSE_TIMEOUT_S)
        self.path = f"/v2/models/{model}/generate"
        self.body = json.dumps({"text_input": prompt, "max_tokens": max_tokens}).encode()
        self.headers = {"Content-Type": "application/json"}
        self.reconnects = 0

    def request(self) -> _Sample:
        try:
            return self._request()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            # A kept-alive connection closed by the server: reconnect once, as HTTP clients do
            # with pooled connections (counted in the result; the clock restarts).
            self.connection.close()
            self.connection = http.client.HTTPConnection(self.host, self.port, timeout=_RESPONSE_TIMEOUT_S)
            self.reconnects += 1
            return self._request()

    def _request(self) -> _Sample:
        start = time.perf_counter()
        self.connection.request("POST", self.path, body=self.body, headers=self.headers)
        response = self.connection.getresponse()
        data = response.read()
        latency = time.perf_counter() - start
        if response.status != 200:
            raise RuntimeError(f"POST {self.path}: HTTP {response.status}: {data[:500]!r}")
        return _Sample(latency, json.loads(data)["text_output"], 1)

    def close(self) -> None:
        self.connection.close()  # an open keep-alive connection would hold up the server's shutdown


class GrpcStream:
    """Requests one after another on one open gRPC stream (as a streaming client keeps it)."""

    def __init__(self, url: str, model: str, prompt: str, max_tokens: int, stream: bool) -> None:
        import numpy as np
        import tritonclient.grpc as grpcclient

        self.model = model
        self.client = grpcclient.InferenceServerClient(url)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.responses.put((time.perf_counter(), result, error)))
        self.inputs = []
        for name, array, datatype in (
            ("text_input", np.array([[prompt.encode("utf-8")]], dtype=np.object_), "BYTES"),
            ("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
            ("stream", np.array([[stream]], dtype=np.bool_), "BOOL"),
        ):
            tensor = grpcclient.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            self.inputs.append(tensor)

    def request(self) -> _Sample:
        request_id = uuid.uuid4().hex
        start = time.perf_counter()
        self.client.async_stream_infer(self.model, self.inputs, request_id=request_id, enable_empty_final_response=True)
        times, parts = [], []
        while True:
            arrived, result, error = self.responses.get(timeout=_RESPONSE_TIMEOUT_S)
            if error is not None:
                raise RuntimeError(f"{self.model}: {error}")
            response = result.get_response()
            if response.id != request_id:
                raise RuntimeError(f"{self.model}: a response of request {response.id!r} arrived during {request_id!r}")
            array = result.as_numpy("text_output")
            if array is not None:
                parts.append(array.reshape(-1)[0].decode("utf-8"))
                times.append(arrived)
            if response.parameters["triton_final_response"].bool_param:
                latency = arrived - start
                break
        if not times:
            raise RuntimeError(f"{self.model}: request {request_id} ended without text")
        return _Sample(latency, "".join(parts), len(times), times[0] - start, _gaps(times))

    def close(self) -> None:
        try:
            self.client.stop_stream()
        finally:
            self.client.close()


def _gaps(times: list[float]) -> tuple[float, ...]:
    return tuple(later - earlier for earlier, later in zip(times, times[1:]))


# -- measuring ---------------------------------------------------------------------------------
class _Tally:
    """One path's samples and clocks, summed over its rounds."""

    def __init__(self) -> None:
        self.reconnects = 0
        self.samples: list[_Sample] = []
        self.round_wall: list[float] = []
        self.server_cpu = 0.0
        self.client_cpu = 0.0


def _run_round(workers: list, count: int, tally: _Tally, server_pgid: int | None) -> None:
    """`count` requests spread over the workers (closed loop: one request in flight per worker)."""
    server_before = _group_cpu_seconds(server_pgid) if server_pgid else 0.0
    client_before = time.process_time()
    started = time.perf_counter()
    if len(workers) == 1:
        samples = [workers[0].request() for _ in range(count)]
    else:
        samples, errors, lock = [], [], threading.Lock()
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
        tally.server_cpu += _group_cpu_seconds(server_pgid) - server_before
    tally.samples.extend(samples)


def _group_cpu_seconds(pgid: int) -> float:
    """User + system CPU time of every live process in the process group (server and stubs)."""
    ticks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ..., utime (11), stime (12)
            ticks += int(fields[11]) + int(fields[12])
    return ticks / _CLK_TCK


def run_part(
    paths, make_workers: Callable[[MeasuredPath], list], *, requests: int, warmup: int, rounds: int,
    server_pgid: int, say: Callable[[str], None], title: str, all_workers: list,
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
        order = list(paths[number % len(paths):]) + list(paths[: number % len(paths)])
        for path in order:
            pgid = server_pgid if path.kind in ("http", "grpc") else None
            _run_round(workers[path.name], count, tallies[path.name], pgid)
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
    }
