"""The serving-overhead benchmark: what Triton adds on top of the engine (cpu target, real tritonserver).

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

What it measures is an `OverheadOptions`. The machine is shared and noisy, so every path runs in
`rounds` interleaved rounds (the order rotates), each path's warm-up first. Besides wall time, the CPU time of the server's process
group (tritonserver and its Python stubs) and of this process is recorded per request: it is
disturbed far less by neighbours than latency. torch runs one intra-op thread on both sides by
default (`torch_threads`). Every path must give the in-process text (checked). The result is a
JSON-ready dict (figures.py makes its rows, recipe.py its recipe); `render_serve_markdown` makes the tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import functools
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypedDict

from bench.overhead import environment
from bench.overhead.figures import single_token_rows, streaming_rows
from bench.overhead.paths import (
    SINGLE_TOKEN_PATHS,
    STREAM_PATHS,
    GrpcStream,
    HttpGenerate,
    InProcess,
    InProcessLoop,
    MeasuredPath,
    Tokenizer,
)
from bench.overhead.recipe import recipe
from bench.overhead.records import InProcessSetup, OverheadOptions, ServerSitting
from bench.overhead.rounds import run_part
from bench.overhead.sweep import SWEEP_PATHS, run_sweep, sweep_rows
from pipeline.config.spec import DeploySpec
from pipeline.errors import StageError
from pipeline.load.serving import LOOPBACK, free_ports, server_version
from pipeline.serve import ServerOptions, TritonServer
from pipeline.serve import process as _process

Say = Callable[[str], None]


def run_serve_bench(
    repo: Path,
    engine_dir: Path,
    tokenizer_dir: Path,
    deploy: DeploySpec,
    options: OverheadOptions | None = None,
    *,
    progress: Say | None = None,
) -> dict[str, Any]:
    """Run the whole benchmark against a server it starts (and stops) itself; a JSON-ready dict.

    `repo` is the packaged model repository (package-*/model_repository), `engine_dir` and
    `tokenizer_dir` the engine and tokenizer it serves (loaded here for the in-process paths).
    `deploy` gives the server's settings; its ports and address are replaced by free ports on
    127.0.0.1. `progress(line)` receives status lines."""
    import torch

    if options is None:
        options = OverheadOptions()
    say = progress or (lambda line: None)
    repo, engine_dir, tokenizer_dir = Path(repo), Path(engine_dir), Path(tokenizer_dir)
    started_at = _dt.datetime.now(_dt.timezone.utc)
    clock_start = time.monotonic()
    load_before = os.getloadavg()[0]
    single_paths, stream_paths = _measured(SINGLE_TOKEN_PATHS, options), _measured(STREAM_PATHS, options)
    with _torch_threads(options.torch_threads):
        local = load_in_process(repo, engine_dir, tokenizer_dir, options)
        say(f"in-process engine loaded ({local.engine_settings}); prompt {len(local.prompt_ids)} tokens")
        sitting = measure_served(repo, deploy, local, options, (single_paths, stream_paths), say)
        torch_threads_used = torch.get_num_threads()
    say(f"tritonserver stopped (exit code {sitting.returncode})")

    mismatches: list[str] = []
    single_rows, baseline = single_token_rows(single_paths, sitting.single, local.expected[1], options.concurrency, mismatches)
    tokens = options.stream_tokens
    stream_rows = streaming_rows(stream_paths, sitting.streamed, local.expected[tokens], tokens, single_rows, mismatches)
    swept_rows = sweep_rows(_measured(SWEEP_PATHS, options), sitting.swept, tokens, local.expected[tokens], mismatches)
    dirs = {"repo": repo, "engine_dir": engine_dir, "tokenizer_dir": tokenizer_dir}
    recorded = recipe(options, local, sitting, dirs=dirs, deploy=deploy, torch_threads=torch_threads_used)
    recorded["started"] = started_at.isoformat(timespec="seconds")
    recorded["wall_s"] = round(time.monotonic() - clock_start, 1)
    recorded["load_average_1min"] = {"start": round(load_before, 2), "end": round(os.getloadavg()[0], 2)}
    return {
        "recipe": recorded,
        "single_token": {"baseline": baseline, "expected_text": local.expected[1], "rows": single_rows},
        "streaming": {"tokens": tokens, "baseline": "inprocess", "expected_text": local.expected[tokens], "rows": stream_rows},
        "sweep": {"tokens": tokens, "rows": swept_rows},
        "checks": {
            "texts_match_in_process": not mismatches,
            "mismatches": mismatches,
            "server_exit_code": sitting.returncode,
            "server_process_group_left": sitting.process_group_left,
        },
        "server_engine_metrics_at_end": sitting.engine_metrics_at_end,
    }


def _measured(paths: tuple[MeasuredPath, ...], options: OverheadOptions) -> tuple[MeasuredPath, ...]:
    return tuple(path for path in paths if options.include_bls or path.model != "tensorrt_llm_bls")


@contextlib.contextmanager
def _torch_threads(count: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `count` in this process for the block (None: left as they are), restored afterwards."""
    import torch

    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def load_in_process(repo: Path, engine_dir: Path, tokenizer_dir: Path, options: OverheadOptions) -> InProcessSetup:
    """The served repository's tokenizer code and the engine with the served settings, in this
    process, and the greedy text of the prompt every path must give."""
    from refengine import LLMEngine, SamplingParams

    tok = Tokenizer(repo, tokenizer_dir)
    settings = environment.engine_settings(repo)
    engine = LLMEngine.from_engine_dir(engine_dir, **settings)
    loop_engine = LLMEngine.from_engine_dir(engine_dir, **settings)  # the loop's own (no lock sharing)
    prompt_ids = tok.encode(options.prompt)
    tokens = options.stream_tokens
    [reference] = engine.generate([prompt_ids], SamplingParams(max_tokens=tokens, temperature=0.0, end_id=tok.tokenizer.eos_id))
    reference_ids = list(reference.outputs[0].token_ids)
    if len(reference_ids) != tokens:
        raise ValueError(f"the prompt {options.prompt!r} ends after {len(reference_ids)} of {tokens} greedy tokens (end id); choose another prompt")
    expected = {1: tok.delta(prompt_ids, reference_ids[:1]), tokens: tok.delta(prompt_ids, reference_ids)}
    return InProcessSetup(tok, engine, loop_engine, settings, prompt_ids, expected)


def measure_served(
    repo: Path,
    deploy: DeploySpec,
    local: InProcessSetup,
    options: OverheadOptions,
    paths: tuple[tuple[MeasuredPath, ...], tuple[MeasuredPath, ...]],
    say: Say,
) -> ServerSitting:
    """One tritonserver sitting on free loopback ports: parts (1) and (2) over `paths` (single-token,
    streamed), then the server stopped, whatever happened."""
    from refengine import EngineLoop

    http_port, grpc_port, metrics_port = free_ports(3)
    server_options = dataclasses.replace(
        ServerOptions.from_deploy(deploy, repo),
        bind_address=LOOPBACK,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        exit_timeout_secs=5,
    )
    loop = EngineLoop(local.loop_engine).start()
    server = TritonServer(server_options)
    open_workers: list = []
    try:
        startup_s, version = _start(server, options, say)
        workers = functools.partial(_workers, local=local, loop=loop, server_options=server_options, prompt=options.prompt)
        common: _PartKeywords = {"server_pgid": server.pid, "say": say, "all_workers": open_workers, "stats_url": server_options.http_url}
        say(f"(1) 1-token requests: {options.requests} per path after {options.warmup} warm-up, {options.concurrency} caller(s), {options.rounds} rounds")
        single = run_part(
            paths[0],
            functools.partial(workers, max_tokens=1, callers=options.concurrency),
            requests=options.requests,
            warmup=options.warmup,
            rounds=options.rounds,
            title="(1)",
            **common,
        )
        say(
            f"(2) {options.stream_tokens}-token requests: {options.stream_requests} per path after "
            f"{options.stream_warmup} warm-up, {options.stream_rounds} rounds"
        )
        streamed = run_part(
            paths[1],
            functools.partial(workers, max_tokens=options.stream_tokens, callers=1),
            requests=options.stream_requests,
            warmup=options.stream_warmup,
            rounds=options.stream_rounds,
            title="(2)",
            **common,
        )
        sweep_paths = _measured(SWEEP_PATHS, options)
        swept = run_sweep(
            sweep_paths,
            functools.partial(workers, max_tokens=options.stream_tokens),
            options.sweep,
            minimum_requests=options.sweep_requests,
            rounds=2,
            **common,
        )
        metrics = environment.engine_metrics(server_options.metrics_url)
    except BaseException as error:
        # The server's log goes with its temporary workspace; keep what it says with the error.
        if server.workspace is not None:
            running = "running" if server.is_running() else "NOT running"
            add_error_note(error, f"tritonserver was {running}; its errors: {server.error_lines()}\nlog tail:\n{server.log_tail(15)}", say)
        raise
    finally:
        _close_quietly(open_workers)
        loop.stop()
        returncode, group_left = _stop(server)
    return ServerSitting(single, streamed, swept, server_options, startup_s, version, metrics, returncode, group_left)


def _start(server: TritonServer, options: OverheadOptions, say: Say) -> tuple[float, str | None]:
    """Start the server (with torch's threads for its stubs) and wait for it: (start-up seconds, its version)."""
    server_options = server.options
    say(f"starting tritonserver on {LOOPBACK} (HTTP {server_options.http_port}, gRPC {server_options.grpc_port}, metrics {server_options.metrics_port})")
    t0 = time.monotonic()
    threads = options.torch_threads
    with environment.bench_environment({"OMP_NUM_THREADS": str(threads)} if threads is not None else {}):
        server.start()
    server.wait_until_ready(timeout=options.startup_timeout)
    startup_s = time.monotonic() - t0
    version = server_version(server_options.http_url)
    say(f"tritonserver {version} ready in {startup_s:.1f} s (pid {server.pid})")
    return startup_s, version


class _PartKeywords(TypedDict):
    """The keywords run_part and run_sweep share within one sitting."""

    server_pgid: int
    say: Say
    all_workers: list[Any]
    stats_url: str | None


def add_error_note(error: BaseException, note: str, say: Say) -> None:
    """`note` on `error` (BaseException.add_note, Python 3.11+); said instead on Python 3.10, which has no notes."""
    if sys.version_info >= (3, 11):
        error.add_note(note)
    else:
        say(note)


def _workers(path: MeasuredPath, *, local: InProcessSetup, loop: Any, server_options: ServerOptions, prompt: str, max_tokens: int, callers: int) -> list:
    """The callers of one path, each with its own connection (`engine.generate` has one caller by nature)."""
    if path.kind == "inprocess":
        return [InProcess(local.engine, local.tok, prompt, max_tokens)]
    if path.kind == "loop":
        return [InProcessLoop(loop, local.tok, prompt, max_tokens, path.stream) for _ in range(callers)]
    if path.model is None:
        raise ValueError(f"measured path {path.name}: a {path.kind} path names the Triton model it calls")
    if path.kind == "http":
        return [HttpGenerate(LOOPBACK, server_options.http_port, path.model, prompt, max_tokens) for _ in range(callers)]
    return [GrpcStream(server_options.grpc_url, path.model, prompt, max_tokens, path.stream) for _ in range(callers)]


def _close_quietly(workers: list) -> None:
    for worker in workers:
        try:
            worker.close()
        except Exception:  # closing is best effort; the server is stopped regardless
            pass


def _stop(server: TritonServer) -> tuple[int | None, bool]:
    """Stop the server: (its exit code, whether anything of its process group was left, and killed)."""
    try:
        pid = server.pid
    except StageError:  # never started
        pid = None
    returncode = server.stop()
    group_left = bool(pid and _process.group_alive(pid))
    if group_left and pid is not None:
        _process.kill_group(pid)
    return returncode, group_left
