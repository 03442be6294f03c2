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
import os
import time
from pathlib import Path
from typing import Any, Callable

from pipeline.config.spec import DeploySpec
from pipeline.errors import StageError
from pipeline.serve import ServerOptions, TritonServer
from pipeline.serve import process as _process
from pipeline.bench.overhead import environment
from pipeline.loadtest.serving import LOOPBACK, free_ports
from pipeline.loadtest.serving import server_version as read_server_version
from pipeline.bench.overhead.paths import (
    ONE_TOKEN_OF,
    SINGLE_TOKEN_PATHS,
    STREAM_PATHS,
    GrpcStream,
    HttpGenerate,
    InProcess,
    InProcessLoop,
    MeasuredPath,
    Tokenizer,
    ms_summary,
    result_row,
    run_part,
)

DEFAULT_PROMPT = "def foo(x):\n    return"
STREAM_TOKENS = 64



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
    tok = Tokenizer(repo, tokenizer_dir)
    engine_settings = environment.engine_settings(repo)
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

    http_port, grpc_port, metrics_port = free_ports(3)
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
        with environment.bench_environment({"OMP_NUM_THREADS": str(torch_threads)} if torch_threads is not None else {}):
            server.start()
        server.wait_until_ready(timeout=startup_timeout)
        startup_s = time.monotonic() - t0
        server_pid = server.pid
        server_version = read_server_version(options.http_url)
        say(f"tritonserver {server_version} ready in {startup_s:.1f} s (pid {server_pid})")

        def make_workers(max_tokens: int, callers: int) -> Callable[[MeasuredPath], list]:
            def make(path: MeasuredPath) -> list:
                if path.kind == "inprocess":
                    return [InProcess(engine, tok, prompt, max_tokens)]
                count = callers
                if path.kind == "loop":
                    return [InProcessLoop(loop, tok, prompt, max_tokens, path.stream) for _ in range(count)]
                if path.kind == "http":
                    return [HttpGenerate(LOOPBACK, http_port, path.model, prompt, max_tokens) for _ in range(count)]
                return [GrpcStream(options.grpc_url, path.model, prompt, max_tokens, path.stream) for _ in range(count)]
            return make

        say(f"(1) 1-token requests: {requests} per path after {warmup} warm-up, {concurrency} caller(s), {rounds} rounds")
        single = run_part(
            single_paths, make_workers(1, concurrency), requests=requests, warmup=warmup, rounds=rounds,
            server_pgid=server_pid, say=say, title="(1)", all_workers=open_workers,
        )
        say(f"(2) {stream_tokens}-token requests: {stream_requests} per path after {stream_warmup} warm-up, {stream_rounds} rounds")
        streamed = run_part(
            stream_paths, make_workers(stream_tokens, 1), requests=stream_requests, warmup=stream_warmup, rounds=stream_rounds,
            server_pgid=server_pid, say=say, title="(2)", all_workers=open_workers,
        )
        metrics_tail = environment.engine_metrics(options.metrics_url)
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
        row = result_row(path, single[path.name], 1 if path.kind == "inprocess" else concurrency)
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
        row = result_row(path, tally, 1)
        wrong = sum(sample.text != expected[stream_tokens] for sample in tally.samples)
        row["texts_match_in_process"] = wrong == 0
        if wrong:
            mismatches.append(f"(2) {path.name}: {wrong} texts differ from the in-process text")
        p50 = row["latency_ms"]["p50"]
        row["per_token_ms"] = round(p50 / stream_tokens, 4)
        one = ONE_TOKEN_OF.get(path.name)
        if one is not None and one in by_name:
            row["marginal_per_token_ms"] = round((p50 - by_name[one]["latency_ms"]["p50"]) / (stream_tokens - 1), 4)
            row["one_token_path"] = one
        else:
            row["marginal_per_token_ms"] = None
            row["one_token_path"] = None
        if path.stream:
            row["ttft_ms"] = ms_summary([sample.ttft for sample in tally.samples])
            row["inter_response_ms"] = ms_summary([gap for sample in tally.samples for gap in sample.gaps])
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

    recipe = environment.recipe(
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
