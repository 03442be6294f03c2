"""The serving benchmark: what Triton adds on top of the engine (cpu target, real tritonserver).

`run_serve_bench` starts its own tritonserver on the packaged model repository (free ports on
127.0.0.1), loads the same engine directory in this process with the same engine settings (read
from the repository's `tensorrt_llm/config.pbtxt`), and measures, in one sitting, side by side,
with one short prompt and greedy decoding:

  (1) a 1-token generate: requests/s and latency (p50/p90/p99) through the ensemble over HTTP
      `/v2/models/ensemble/generate`, over gRPC (a stream with `stream=false`: the repository
      is decoupled, so unary ModelInfer is refused) and `stream=true`, the same for the BLS model
      `tensorrt_llm_bls`, against refengine in this process (tokenize + `engine.generate` +
      detokenize) and through an `EngineLoop` (the background step thread the `tensorrt_llm`
      model wraps);
  (2) `stream_tokens` (64) tokens: streamed over gRPC against non-streamed over gRPC against
      in-process (`engine.generate`; and `EngineLoop` streamed with incremental detokenization),
      for the ensemble and the BLS model: per-token ms, marginal per-token ms against the same
      path's 1-token latency, time to first token and gaps between streamed responses.

The machine is shared and noisy, so every path runs in `rounds` interleaved rounds (the order
rotates), each path's warm-up first. Besides wall time, the CPU time of the server's process
group (tritonserver and its Python stubs) and of this process is recorded per request: it is
disturbed far less by neighbours than latency. torch runs one intra-op thread on both sides by
default (`torch_threads`). Every path must give the in-process text (checked). The result is a JSON-ready dict; `render_serve_markdown` makes the tables.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import http.client
import importlib.metadata
import importlib.util
import json
import os
import platform
import queue
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable

from pipeline.config.spec import DeploySpec
from pipeline.errors import StageError
from pipeline.serve import ServerOptions, TritonServer
from pipeline.serve import process as _process

DEFAULT_PROMPT = "def foo(x):\n    return"
STREAM_TOKENS = 64
LOOPBACK = "127.0.0.1"
_RESPONSE_TIMEOUT_S = 120.0
_REPO_ROOT = Path(__file__).resolve().parents[2]
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- paths ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Path:
    name: str  # JSON key
    label: str  # table row
    kind: str  # "inprocess" | "loop" | "http" | "grpc"
    model: str | None = None
    stream: bool = False


SINGLE_TOKEN_PATHS = (
    _Path("inprocess", "in-process: tokenize + `engine.generate` + detokenize", "inprocess"),
    _Path("inprocess_loop", "in-process: `EngineLoop` submit (step thread) + detokenize", "loop"),
    _Path("http_ensemble", "ensemble, HTTP `/generate`", "http", "ensemble"),
    _Path("grpc_ensemble", "ensemble, gRPC stream, `stream=false`", "grpc", "ensemble"),
    _Path("grpc_ensemble_streamed", "ensemble, gRPC stream, `stream=true`", "grpc", "ensemble", True),
    _Path("http_bls", "BLS, HTTP `/generate`", "http", "tensorrt_llm_bls"),
    _Path("grpc_bls", "BLS, gRPC stream, `stream=false`", "grpc", "tensorrt_llm_bls"),
    _Path("grpc_bls_streamed", "BLS, gRPC stream, `stream=true`", "grpc", "tensorrt_llm_bls", True),
)
STREAM_PATHS = (
    _Path("inprocess", "in-process: `engine.generate` N tokens + detokenize", "inprocess"),
    _Path("inprocess_loop_streamed", "in-process: `EngineLoop`, streamed, incremental detokenize", "loop", None, True),
    _Path("grpc_ensemble", "ensemble, gRPC, `stream=false`", "grpc", "ensemble"),
    _Path("grpc_ensemble_streamed", "ensemble, gRPC, `stream=true`", "grpc", "ensemble", True),
    _Path("grpc_bls", "BLS, gRPC, `stream=false`", "grpc", "tensorrt_llm_bls"),
    _Path("grpc_bls_streamed", "BLS, gRPC, `stream=true`", "grpc", "tensorrt_llm_bls", True),
)
# The 1-token row each N-token row is compared with (marginal cost of the other N - 1 tokens).
_ONE_TOKEN_OF = {
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
class _Tokenizer:
    """The served repository's own tokenizer and detokenizer code, loaded in this process."""

    def __init__(self, repo: Path, tokenizer_dir: Path) -> None:
        hf_tokenizer = _load_module(repo / "preprocessing" / "1" / "hf_tokenizer.py", "_serve_bench_hf_tokenizer")
        detok = _load_module(repo / "postprocessing" / "1" / "incremental_detokenizer.py", "_serve_bench_incremental_detokenizer")
        self.tokenizer = hf_tokenizer.HFTokenizer(tokenizer_dir)
        self.text_delta = detok.text_delta
        self.context_tokens = detok.CONTEXT_TOKENS
        self.IncrementalDetokenizer = detok.IncrementalDetokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def delta(self, prompt_ids: list[int], new_ids: list[int]) -> str:
        return self.text_delta(self.tokenizer.decode, prompt_ids[-self.context_tokens :], new_ids)


class _InProcess:
    def __init__(self, engine, tok: _Tokenizer, prompt: str, max_tokens: int) -> None:
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


class _InProcessLoop:
    def __init__(self, loop, tok: _Tokenizer, prompt: str, max_tokens: int, stream: bool) -> None:
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


class _HttpGenerate:
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


class _GrpcStream:
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


def _run_part(
    paths, make_workers: Callable[[_Path], list], *, requests: int, warmup: int, rounds: int,
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


def _ms(values: list[float]) -> dict[str, float]:
    values = [value * 1000.0 for value in values]
    return {
        "p50": round(_percentile(values, 50), 3),
        "p90": round(_percentile(values, 90), 3),
        "p99": round(_percentile(values, 99), 3),
        "mean": round(statistics.fmean(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def _row(path: _Path, tally: _Tally, callers: int) -> dict[str, Any]:
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
        "latency_ms": _ms([sample.latency for sample in tally.samples]),
        "server_cpu_ms_per_request": round(tally.server_cpu * 1000.0 / count, 3) if server else None,
        "client_cpu_ms_per_request": round(tally.client_cpu * 1000.0 / count, 3),
        "total_cpu_ms_per_request": round((tally.server_cpu + tally.client_cpu) * 1000.0 / count, 3),
        "responses_per_request": round(statistics.fmean(sample.responses for sample in tally.samples), 3),
        "http_reconnects": tally.reconnects if path.kind == "http" else None,
    }


# -- the benchmark ------------------------------------------------------------------------------
def run_serve_bench(
    repo: Path,
    engine_dir: Path,
    tokenizer_dir: Path,
    deploy: DeploySpec,
    *,
    requests: int = 200,
    warmup: int = 20,
    concurrency: int = 1,
    progress: Callable[[str], None] | None = None,
    stream_tokens: int = STREAM_TOKENS,
    stream_requests: int = 32,
    stream_warmup: int = 3,
    rounds: int = 4,
    stream_rounds: int = 4,
    prompt: str = DEFAULT_PROMPT,
    include_bls: bool = True,
    torch_threads: int | None = 1,
    startup_timeout: float = 180.0,
) -> dict[str, Any]:
    """Run the whole benchmark against a server it starts (and stops) itself; a JSON-ready dict.

    `repo` is the packaged model repository (package-*/model_repository), `engine_dir` and
    `tokenizer_dir` the engine and tokenizer it serves (loaded here for the in-process paths).
    `deploy` gives the server's settings; its ports and address are replaced by free ports on
    127.0.0.1. Part (1): `requests` 1-token requests per path after `warmup`, with `concurrency`
    callers per path (closed loop; `engine.generate` has one caller by nature). Part (2):
    `stream_requests` requests of `stream_tokens` tokens per path after `stream_warmup`, one
    caller. Each part runs in interleaved rounds (`rounds`, `stream_rounds`). `torch_threads`
    (default 1, as the engine bench) sets torch's intra-op threads on both sides: OMP_NUM_THREADS
    for the server (its stubs inherit it) and `torch.set_num_threads` here, restored afterwards.
    On a small shared machine one thread keeps the engine's own time steady, so the differences
    are Triton's; None measures as deployed (torch's default thread count on both sides)."""
    import torch

    say = progress or (lambda line: None)
    repo, engine_dir, tokenizer_dir = Path(repo), Path(engine_dir), Path(tokenizer_dir)
    if concurrency < 1 or requests < 1 or stream_requests < 1 or stream_tokens < 2:
        raise ValueError("concurrency, requests and stream_requests must be >= 1, stream_tokens >= 2")
    started_at = _dt.datetime.now(_dt.timezone.utc)
    clock_start = time.monotonic()
    load_before = os.getloadavg()[0]
    single_paths = tuple(p for p in SINGLE_TOKEN_PATHS if include_bls or p.model != "tensorrt_llm_bls")
    stream_paths = tuple(p for p in STREAM_PATHS if include_bls or p.model != "tensorrt_llm_bls")

    # In this process: the served repository's tokenizer code, the engine with the served settings.
    from refengine import EngineLoop, LLMEngine, SamplingParams

    threads_before = torch.get_num_threads()
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    tok = _Tokenizer(repo, tokenizer_dir)
    engine_settings = _engine_settings(repo)
    engine = LLMEngine.from_engine_dir(engine_dir, **engine_settings)
    loop_engine = LLMEngine.from_engine_dir(engine_dir, **engine_settings)  # the loop's own (no lock sharing)
    prompt_ids = tok.encode(prompt)
    [reference] = engine.generate([prompt_ids], SamplingParams(max_tokens=stream_tokens, temperature=0.0, end_id=tok.tokenizer.eos_id))
    reference_ids = list(reference.outputs[0].token_ids)
    if len(reference_ids) != stream_tokens:
        torch.set_num_threads(threads_before)
        raise ValueError(
            f"the prompt {prompt!r} ends after {len(reference_ids)} of {stream_tokens} greedy tokens (end id); choose another prompt"
        )
    expected = {1: tok.delta(prompt_ids, reference_ids[:1]), stream_tokens: tok.delta(prompt_ids, reference_ids)}
    say(f"in-process engine loaded ({engine_settings}); prompt {len(prompt_ids)} tokens")

    http_port, grpc_port, metrics_port = _free_ports(3)
    options = dataclasses.replace(
        ServerOptions.from_deploy(deploy, repo),
        bind_address=LOOPBACK, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, exit_timeout_secs=5,
    )
    loop = EngineLoop(loop_engine).start()
    server = TritonServer(options)
    open_workers: list = []
    stop_info: dict[str, Any] = {}
    try:
        say(f"starting tritonserver on {LOOPBACK} (HTTP {http_port}, gRPC {grpc_port}, metrics {metrics_port})")
        t0 = time.monotonic()
        with _environment({"OMP_NUM_THREADS": str(torch_threads)} if torch_threads is not None else {}):
            server.start()
        server.wait_until_ready(timeout=startup_timeout)
        startup_s = time.monotonic() - t0
        server_pid = server.pid
        server_version = _server_version(options.http_url)
        say(f"tritonserver {server_version} ready in {startup_s:.1f} s (pid {server_pid})")

        def make_workers(max_tokens: int, callers: int) -> Callable[[_Path], list]:
            def make(path: _Path) -> list:
                if path.kind == "inprocess":
                    return [_InProcess(engine, tok, prompt, max_tokens)]
                count = callers
                if path.kind == "loop":
                    return [_InProcessLoop(loop, tok, prompt, max_tokens, path.stream) for _ in range(count)]
                if path.kind == "http":
                    return [_HttpGenerate(LOOPBACK, http_port, path.model, prompt, max_tokens) for _ in range(count)]
                return [_GrpcStream(options.grpc_url, path.model, prompt, max_tokens, path.stream) for _ in range(count)]
            return make

        say(f"(1) 1-token requests: {requests} per path after {warmup} warm-up, {concurrency} caller(s), {rounds} rounds")
        single = _run_part(
            single_paths, make_workers(1, concurrency), requests=requests, warmup=warmup, rounds=rounds,
            server_pgid=server_pid, say=say, title="(1)", all_workers=open_workers,
        )
        say(f"(2) {stream_tokens}-token requests: {stream_requests} per path after {stream_warmup} warm-up, {stream_rounds} rounds")
        streamed = _run_part(
            stream_paths, make_workers(stream_tokens, 1), requests=stream_requests, warmup=stream_warmup, rounds=stream_rounds,
            server_pgid=server_pid, say=say, title="(2)", all_workers=open_workers,
        )
        metrics_tail = _engine_metrics(options.metrics_url)
    except BaseException as error:
        # The server's log goes with its temporary workspace; keep what it says with the error.
        if server.workspace is not None:
            running = "running" if server.is_running() else "NOT running"
            error.add_note(f"tritonserver was {running}; its errors: {server.error_lines()}\nlog tail:\n{server.log_tail(15)}")
        raise
    finally:
        for worker in open_workers:
            try:
                worker.close()
            except Exception:  # closing is best effort; the server is stopped regardless
                pass
        loop.stop()
        try:
            pid = server.pid
        except StageError:  # never started
            pid = None
        stop_info["returncode"] = server.stop()
        stop_info["process_group_left"] = bool(pid and _process.group_alive(pid))
        if stop_info["process_group_left"]:
            _process.kill_group(pid)
        torch_threads_used = torch.get_num_threads()
        torch.set_num_threads(threads_before)
    say(f"tritonserver stopped (exit code {stop_info.get('returncode')})")

    # -- figures ---------------------------------------------------------------------------
    mismatches = []
    single_rows = []
    for path in single_paths:
        row = _row(path, single[path.name], 1 if path.kind == "inprocess" else concurrency)
        wrong = sum(sample.text != expected[1] for sample in single[path.name].samples)
        row["texts_match_in_process"] = wrong == 0
        if wrong:
            mismatches.append(f"(1) {path.name}: {wrong} texts differ from the in-process text")
        single_rows.append(row)
    baseline_name = "inprocess" if concurrency == 1 else "inprocess_loop"
    by_name = {row["path"]: row for row in single_rows}
    base = by_name[baseline_name]
    for row in single_rows:
        row["p50_vs_baseline"] = round(row["latency_ms"]["p50"] / base["latency_ms"]["p50"], 3)
        row["p99_vs_baseline"] = round(row["latency_ms"]["p99"] / base["latency_ms"]["p99"], 3)
        row["throughput_baseline_over_this"] = round(base["requests_per_s"] / row["requests_per_s"], 3)
        row["p50_overhead_ms"] = round(row["latency_ms"]["p50"] - base["latency_ms"]["p50"], 3)
        row["total_cpu_vs_baseline"] = round(row["total_cpu_ms_per_request"] / base["total_cpu_ms_per_request"], 3)

    stream_rows = []
    for path in stream_paths:
        tally = streamed[path.name]
        row = _row(path, tally, 1)
        wrong = sum(sample.text != expected[stream_tokens] for sample in tally.samples)
        row["texts_match_in_process"] = wrong == 0
        if wrong:
            mismatches.append(f"(2) {path.name}: {wrong} texts differ from the in-process text")
        p50 = row["latency_ms"]["p50"]
        row["per_token_ms"] = round(p50 / stream_tokens, 4)
        one = _ONE_TOKEN_OF.get(path.name)
        if one is not None and one in by_name:
            row["marginal_per_token_ms"] = round((p50 - by_name[one]["latency_ms"]["p50"]) / (stream_tokens - 1), 4)
            row["one_token_path"] = one
        else:
            row["marginal_per_token_ms"] = None
            row["one_token_path"] = None
        if path.stream:
            row["ttft_ms"] = _ms([sample.ttft for sample in tally.samples])
            row["inter_response_ms"] = _ms([gap for sample in tally.samples for gap in sample.gaps])
        row["server_cpu_ms_per_token"] = (
            round(row["server_cpu_ms_per_request"] / stream_tokens, 4) if row["server_cpu_ms_per_request"] is not None else None
        )
        row["total_cpu_ms_per_token"] = round(row["total_cpu_ms_per_request"] / stream_tokens, 4)
        stream_rows.append(row)
    stream_by_name = {row["path"]: row for row in stream_rows}
    inproc = stream_by_name["inprocess"]
    for row in stream_rows:
        row["per_token_vs_in_process"] = round(row["per_token_ms"] / inproc["per_token_ms"], 3)
        row["total_cpu_vs_in_process"] = round(row["total_cpu_ms_per_request"] / inproc["total_cpu_ms_per_request"], 3)
        partner = {"grpc_ensemble_streamed": "grpc_ensemble", "grpc_bls_streamed": "grpc_bls"}.get(row["path"])
        row["streamed_vs_non_streamed"] = (
            round(row["latency_ms"]["p50"] / stream_by_name[partner]["latency_ms"]["p50"], 3) if partner in stream_by_name else None
        )
        if partner in stream_by_name:
            row["streaming_extra_ms_per_token"] = round(
                (row["latency_ms"]["p50"] - stream_by_name[partner]["latency_ms"]["p50"]) / stream_tokens, 4
            )

    recipe = _recipe(
        repo=repo, engine_dir=engine_dir, tokenizer_dir=tokenizer_dir, deploy=deploy, options=options,
        engine=engine, engine_settings=engine_settings, prompt=prompt, prompt_ids=prompt_ids,
        counts={
            "requests": requests, "warmup": warmup, "concurrency": concurrency, "rounds": rounds,
            "stream_tokens": stream_tokens, "stream_requests": stream_requests, "stream_warmup": stream_warmup,
            "stream_rounds": stream_rounds, "include_bls": include_bls,
        },
        server_version=server_version, startup_s=startup_s, torch_threads=torch_threads_used, torch_threads_arg=torch_threads,
    )
    recipe["started"] = started_at.isoformat(timespec="seconds")
    recipe["wall_s"] = round(time.monotonic() - clock_start, 1)
    recipe["load_average_1min"] = {"start": round(load_before, 2), "end": round(os.getloadavg()[0], 2)}
    return {
        "recipe": recipe,
        "single_token": {"baseline": baseline_name, "expected_text": expected[1], "rows": single_rows},
        "streaming": {"tokens": stream_tokens, "baseline": "inprocess", "expected_text": expected[stream_tokens], "rows": stream_rows},
        "checks": {
            "texts_match_in_process": not mismatches,
            "mismatches": mismatches,
            "server_exit_code": stop_info.get("returncode"),
            "server_process_group_left": stop_info.get("process_group_left"),
        },
        "server_engine_metrics_at_end": metrics_tail,
    }


# -- helpers -----------------------------------------------------------------------------------
class _environment:
    """Set environment variables for the `with` block (the server inherits them at start)."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for key, value in self.values.items():
            self.saved[key] = os.environ.get(key)
            os.environ[key] = value

    def __exit__(self, *exc_info: object) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and the like look their module up
    spec.loader.exec_module(module)
    return module


_PARAMETER = re.compile(r'key:\s*"([^"]+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"\s*\}')


def _engine_settings(repo: Path) -> dict[str, Any]:
    """The engine overrides the served `tensorrt_llm` model applies (as its `initialize` does)."""
    parameters = dict(_PARAMETER.findall((repo / "tensorrt_llm" / "config.pbtxt").read_text()))

    def boolean(key: str) -> bool:
        return parameters.get(key, "false").strip().lower() in ("true", "1", "yes", "on")

    return {
        "scheduler_policy": parameters.get("batch_scheduler_policy", "guaranteed_no_evict"),
        "enable_chunked_context": boolean("enable_chunked_context"),
        "enable_prefix_caching": boolean("enable_kv_cache_reuse"),
    }


def _free_ports(count: int) -> list[int]:
    probes = []
    for _ in range(count):
        probe = socket.socket()
        probe.bind((LOOPBACK, 0))
        probes.append(probe)
    ports = [probe.getsockname()[1] for probe in probes]
    for probe in probes:
        probe.close()
    return ports


def _server_version(http_url: str) -> str | None:
    try:
        with urllib.request.urlopen(f"{http_url}/v2", timeout=10) as response:
            return json.loads(response.read()).get("version")
    except Exception:  # a figure for the recipe only
        return None


def _engine_metrics(metrics_url: str) -> dict[str, float]:
    try:
        with urllib.request.urlopen(metrics_url, timeout=10) as response:
            text = response.read().decode()
    except Exception:  # a figure for the record only
        return {}
    values = {}
    for line in text.splitlines():
        if line.startswith(("nv_trt_llm_", "nv_inference_request_success{")):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git() -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_REPO_ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=_REPO_ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        return {"commit": commit or None, "uncommitted_changes": bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "uncommitted_changes": None}


def _recipe(*, repo, engine_dir, tokenizer_dir, deploy, options, engine, engine_settings, prompt, prompt_ids, counts,
            server_version, startup_s, torch_threads, torch_threads_arg) -> dict[str, Any]:
    config = engine.config
    model = engine._model.config if hasattr(engine, "_model") else None
    return {
        "call": (
            f"run_serve_bench(repo, engine_dir, tokenizer_dir, deploy, requests={counts['requests']}, warmup={counts['warmup']}, "
            f"concurrency={counts['concurrency']}, stream_tokens={counts['stream_tokens']}, stream_requests={counts['stream_requests']}, "
            f"stream_warmup={counts['stream_warmup']}, rounds={counts['rounds']}, stream_rounds={counts['stream_rounds']}, "
            f"include_bls={counts['include_bls']}, torch_threads={torch_threads_arg})"
        ),
        "counts": counts,
        "machine": {
            "cpu": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "gpu": None,
        },
        "versions": {
            "python": platform.python_version(),
            "torch": _version("torch"),
            "tritonclient": _version("tritonclient"),
            "nvidia-pytriton": _version("nvidia-pytriton"),
            "tritonserver": server_version,
            "tokenizers": _version("tokenizers"),
            "numpy": _version("numpy"),
            "trtllm-pipeline": _version("trtllm-pipeline"),
            **{f"git_{key}": value for key, value in _git().items()},
        },
        "torch_threads": {
            "this_process": torch_threads,
            "server_stub": (
                f"OMP_NUM_THREADS={torch_threads_arg}" if torch_threads_arg is not None
                else "torch default in the same environment"
                + (f" (OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']})" if "OMP_NUM_THREADS" in os.environ else "")
            ),
        },
        "server": {
            "bind_address": options.bind_address,
            "ports": {"http": options.http_port, "grpc": options.grpc_port, "metrics": options.metrics_port},
            "startup_s": round(startup_s, 2),
            "shm_prefix": options.shm_prefix,
            "deploy": deploy.model_dump(mode="json") if hasattr(deploy, "model_dump") else str(deploy),
        },
        "paths": {
            "repo": str(repo), "engine_dir": str(engine_dir), "tokenizer_dir": str(tokenizer_dir),
        },
        "engine": {
            **{key: getattr(config, key, None) for key in ("max_batch_size", "max_num_tokens", "max_seq_len", "tokens_per_block", "compute_dtype")},
            **engine_settings,
            "model_layers": getattr(model, "num_layers", None),
            "model_hidden": getattr(model, "hidden_size", None),
            "model_vocab": getattr(model, "vocab_size", None),
        },
        "prompt": prompt,
        "prompt_tokens": len(prompt_ids),
        "decoding": "greedy (temperature 0; server: runtime_top_k = runtime_top_p = 0 defaults), end id = tokenizer eos",
        "clients": {
            "http": "http.client keep-alive connection per caller, JSON body {text_input, max_tokens}",
            "grpc": "tritonclient.grpc, one open stream per caller, requests one after another, enable_empty_final_response",
            "latency": "client side: request sent → final response (gRPC: the response flagged triton_final_response)",
        },
    }


# -- tables ------------------------------------------------------------------------------------
def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}"


def render_serve_markdown(result: dict[str, Any]) -> str:
    recipe = result["recipe"]
    counts = recipe["counts"]
    versions = recipe["versions"]
    lines = [
        f"Run {recipe['started']} · {recipe['machine']['cpu']}, {recipe['machine']['cpu_count']} CPU cores (shared), "
        f"tritonserver {versions['tritonserver']} (nvidia-pytriton {versions['nvidia-pytriton']}), tritonclient {versions['tritonclient']}, "
        f"torch {versions['torch']} (intra-op threads: {recipe['torch_threads']['this_process']} in-process; server stub: {recipe['torch_threads']['server_stub']}), "
        f"Python {versions['python']} · repo {versions.get('git_commit')}{' + uncommitted changes' if versions.get('git_uncommitted_changes') else ''} · "
        f"wall {recipe['wall_s']} s, server start-up {recipe['server']['startup_s']} s · 1-min load average {recipe['load_average_1min']['start']} → {recipe['load_average_1min']['end']}",
        "",
        f"Recipe: `{recipe['call']}`  ",
        f"Prompt {recipe['prompt']!r} ({recipe['prompt_tokens']} tokens), greedy. Engine: {recipe['engine']['scheduler_policy']}, "
        f"chunked context {recipe['engine']['enable_chunked_context']}, KV reuse {recipe['engine']['enable_prefix_caching']}, "
        f"{recipe['engine']['compute_dtype']}.",
        "",
        f"(1) 1-token generate: {counts['requests']} requests per path ({counts['warmup']} warm-up), {counts['concurrency']} caller(s), "
        f"{counts['rounds']} interleaved rounds. Ratios against `{result['single_token']['baseline']}`. "
        "CPU = server process group (tritonserver + stubs) + this process, per request.",
        "",
        "| path | req/s | p50 ms | p90 ms | p99 ms | p50 ÷ in-process | p99 ÷ in-process | in-process req/s ÷ this | p50 overhead ms | server CPU ms/req | total CPU ms/req | CPU ÷ in-process |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["single_token"]["rows"]:
        latency = row["latency_ms"]
        lines.append(
            f"| {row['label']} | {_f(row['requests_per_s'], 1)} | {_f(latency['p50'])} | {_f(latency['p90'])} | {_f(latency['p99'])} | "
            f"{_f(row['p50_vs_baseline'])}× | {_f(row['p99_vs_baseline'])}× | {_f(row['throughput_baseline_over_this'])}× | "
            f"{_f(row['p50_overhead_ms'])} | {_f(row['server_cpu_ms_per_request'])} | {_f(row['total_cpu_ms_per_request'])} | "
            f"{_f(row['total_cpu_vs_baseline'])}× |"
        )
    n = result["streaming"]["tokens"]
    lines += [
        "",
        f"(2) {n} tokens per request: {counts['stream_requests']} requests per path ({counts['stream_warmup']} warm-up), one caller, "
        f"{counts['stream_rounds']} interleaved rounds. Per-token = p50 latency ÷ {n}; marginal = (p50 of {n} tokens − p50 of the "
        f"same path's 1-token request in (1)) ÷ {n - 1}; gaps = between consecutive streamed responses.",
        "",
        f"| path | p50 ms ({n} tok) | p99 ms | per-token ms | ÷ in-process | marginal ms/token | streamed ÷ non-streamed | streaming extra ms/token | TTFT p50 ms | gap p50 / p99 ms | responses/req | server CPU ms/token | total CPU ms/token | CPU ÷ in-process |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["streaming"]["rows"]:
        latency = row["latency_ms"]
        ttft = row.get("ttft_ms")
        gaps = row.get("inter_response_ms")
        lines.append(
            f"| {row['label']} | {_f(latency['p50'], 1)} | {_f(latency['p99'], 1)} | {_f(row['per_token_ms'], 3)} | "
            f"{_f(row['per_token_vs_in_process'])}× | {_f(row['marginal_per_token_ms'], 3)} | "
            f"{_f(row['streamed_vs_non_streamed']) + '×' if row['streamed_vs_non_streamed'] is not None else '–'} | "
            f"{_f(row.get('streaming_extra_ms_per_token'), 3)} | {_f(ttft['p50']) if ttft else '–'} | "
            f"{(_f(gaps['p50']) + ' / ' + _f(gaps['p99'])) if gaps else '–'} | {_f(row['responses_per_request'], 1)} | "
            f"{_f(row['server_cpu_ms_per_token'], 3)} | {_f(row['total_cpu_ms_per_token'], 3)} | {_f(row['total_cpu_vs_in_process'])}× |"
        )
    checks = result["checks"]
    lines += [
        "",
        f"Every answer equal to the in-process text: {'yes' if checks['texts_match_in_process'] else 'NO: ' + '; '.join(checks['mismatches'])}. "
        f"Server exit code {checks['server_exit_code']}, process group left after stop: {checks['server_process_group_left']}. "
        f"HTTP keep-alive reconnects: {sum(row.get('http_reconnects') or 0 for part in ('single_token', 'streaming') for row in result[part]['rows'])}.",
    ]
    return "\n".join(lines)
