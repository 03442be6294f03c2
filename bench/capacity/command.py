"""`trtllm-pipeline bench capacity CONFIG`: arguments and command of the capacity benchmark (bench.py)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.capacity.options import (
    DEFAULT_CONCURRENCY,
    DEFAULT_RATE,
    DEFAULT_STREAM_INTERVALS,
    CapacityOptions,
    check_queue,
    checked_options,
    integer_list,
)
from bench.command_support import BuildCpuTarget, dim_lines, status_console, write_and_print

RESULT_NAME = "bench-capacity.json"
HELP = "streamed tokens/s the Python models sustain around a GPU-pace stand-in for tensorrt_llm, and their CPU per token"
CONFIG_HELP = "build config YAML (target cpu: its packaged repository is served with the stand-in in place of the engine)"


def _csv(values: tuple[int, ...]) -> str:
    return ",".join(str(value) for value in values)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", default=_csv(DEFAULT_CONCURRENCY), help=f"streams in flight per point (default {_csv(DEFAULT_CONCURRENCY)})")
    parser.add_argument(
        "--stream-intervals",
        default=_csv(DEFAULT_STREAM_INTERVALS),
        help=f"serve.stream_interval of each server sitting (default {_csv(DEFAULT_STREAM_INTERVALS)})",
    )
    parser.add_argument("--rate", default=DEFAULT_RATE, help=f"the stand-in's tokens/s per request, or 'max' (default {DEFAULT_RATE})")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per request (default 64)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; each runs every path in turn, in a server of its own (default 2)")
    parser.add_argument("--window", type=float, default=4.0, help="measured seconds per path and round (default 4)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each window (default 1)")
    parser.add_argument(
        "--nvidia-models",
        type=Path,
        help="also serve NVIDIA's preprocessing/postprocessing from this directory (TensorRT-LLM's "
        "triton_backend/all_models/inflight_batcher_llm in a scratch checkout) in this project's ensemble",
    )
    parser.add_argument(
        "--paths", default="", help="comma-separated paths to run: ensemble, ensemble_batched, bls, floor, floor_batched, nvidia (default: all)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of tables")


def run_capacity_command(args: argparse.Namespace, build_cpu_target: BuildCpuTarget) -> int:
    from pipeline.artifacts import ArtifactStore, store_root
    from pipeline.config.loader import load_config

    options = checked_options(
        CapacityOptions(  # checked before the config is loaded: a typo costs no build
            concurrency=integer_list(args.concurrency, "--concurrency"),
            stream_intervals=integer_list(args.stream_intervals, "--stream-intervals"),
            rate=args.rate,
            max_tokens=args.tokens,
            rounds=args.rounds,
            window_s=args.window,
            warmup_s=args.warmup,
            nvidia_models=args.nvidia_models.resolve() if args.nvidia_models else None,
            paths=tuple(name.strip() for name in args.paths.split(",") if name.strip()),
        )
    )
    loaded = load_config(args.config, args.overrides)
    check_queue(options, loaded.spec.serve.max_queue_size)
    store = ArtifactStore(store_root(args.artifacts, writable=True), loaded.spec.name)
    results = build_cpu_target(loaded, store, "bench capacity", "package")
    summary = measure(loaded, results, options)
    write_and_print(summary, store.build_dir / RESULT_NAME, args.json, _render, status_console())
    return 0


def measure(loaded, results, options: CapacityOptions) -> dict:
    """Run the bench on a packaged build (`results`: the stage results up to package) and summarize it."""
    from bench.capacity.bench import run_capacity_bench
    from bench.capacity.report import summarize
    from bench.capacity.repository import bench_paths

    engine_dir = results["build"].ref.engine_dir
    tokenizer_dir = results["prepare"].ref.path
    batched = batched_postprocessing_config(loaded, engine_dir, tokenizer_dir)
    result = run_capacity_bench(
        results["package"].ref.repository_dir,
        batched,
        tokenizer_dir,
        loaded.spec.deploy,
        options,
        progress=dim_lines(status_console()),
    )
    paths = bench_paths(loaded.spec.serve.model_name, nvidia_models=options.nvidia_models is not None, only=options.paths)
    return summarize(result, paths, options)


def batched_postprocessing_config(loaded, engine_dir: Path, tokenizer_dir: Path) -> str:
    """postprocessing's config.pbtxt as the package stage renders it with serve.postprocessing_dynamic_batching."""
    from pipeline.render import RepositoryRequest, render_model_repository

    serve = loaded.spec.serve.model_copy(update={"postprocessing_dynamic_batching": True})
    with tempfile.TemporaryDirectory(prefix="capacity-render-") as scratch:
        out = Path(scratch) / "repository"
        render_model_repository(
            RepositoryRequest(engine_dir=engine_dir, tokenizer_dir=tokenizer_dir, serve=serve, target=loaded.spec.build.target, out_dir=out)
        )
        return (out / "postprocessing" / "config.pbtxt").read_text()


def _render(summary: dict) -> str:
    from bench.capacity.report import render_capacity_markdown

    return render_capacity_markdown(summary)
