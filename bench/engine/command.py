"""`trtllm-pipeline bench engine CONFIG`: arguments and command of the engine benchmark (bench.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.command_support import BuildCpuTarget, build_for_bench, dim_lines, status_console, write_and_print

RESULT_NAME = "bench-engine.json"
GUIDED_RESULT_NAME = "bench-engine-guided.json"
LORA_RESULT_NAME = "bench-engine-lora.json"
HELP = "refengine inflight vs static batching vs transformers, KV utilisation, prefix reuse"
CONFIG_HELP = "build config YAML (target cpu)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a small workload (seconds, for smoke tests)")
    parser.add_argument("--requests", type=int, default=128, help="number of requests (default 128)")
    parser.add_argument("--kv-sharing", action="store_true", help="only the KV blocks of beam search and n > 1 sampling vs independent requests")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of tables")
    parser.add_argument("--out", type=Path, help=f"also write the JSON result here (default: <artifacts>/<name>/{RESULT_NAME})")
    parser.add_argument("--guided", action="store_true", help="instead: guided decoding (xgrammar) vs unguided per-token cost, compile time, cache hit rate")
    parser.add_argument(
        "--lora",
        action="store_true",
        help=(
            "instead: tokens/s of 32 requests spread over 8 LoRA adapters vs the same batch without adapters, in one run "
            "(--quick: 8 requests over 4 adapters); JSON only"
        ),
    )


def run_engine_command(args: argparse.Namespace, build_cpu_target: BuildCpuTarget) -> int:
    from bench.engine.bench import EngineBenchOptions, run_engine_bench
    from bench.engine.report import render_markdown
    from pipeline.stages.prepare import checkpoint_dir

    _, store, results = build_for_bench(args, build_cpu_target, "bench engine", "build")
    status = status_console()
    if args.guided:
        return _run_guided(args, results, store, status)
    if args.lora:
        return _run_lora(args, results, store, status)
    if args.kv_sharing:
        from bench.engine.sharing import run_kv_sharing

        out = args.out or store.build_dir / "bench-kv-sharing.json"
        write_and_print(run_kv_sharing(results["build"].ref.engine_dir), out, True, str, status)  # JSON only
        return 0
    result = run_engine_bench(
        results["build"].ref.engine_dir,
        checkpoint_dir(results["prepare"].ref.path),
        EngineBenchOptions(num_requests=args.requests, quick=args.quick),
        progress=dim_lines(status),
    )
    write_and_print(result, args.out or store.build_dir / RESULT_NAME, args.json, render_markdown, status)
    return 0


def _run_lora(args: argparse.Namespace, results: dict, store, status) -> int:
    from bench.engine.lora import LoraBenchOptions, run_lora_bench

    options = LoraBenchOptions(num_requests=8, num_adapters=4, prompt_len=(8, 32), output_mean=8, output_cap=16, rounds=2) if args.quick else LoraBenchOptions()
    result = run_lora_bench(results["build"].ref.engine_dir, options, progress=dim_lines(status))
    out = args.out or store.build_dir / LORA_RESULT_NAME
    write_and_print(result, out, True, str, status)  # the LoRA figures print as JSON only
    target = result["target"]
    status.print(f"median round ratio lora / base tokens/s: {target['value']} (goal >= {target['goal']}: {'met' if target['met'] else 'not met'})")
    status.print(f"wrote {out}")
    return 0


def _run_guided(args: argparse.Namespace, results: dict, store, status) -> int:
    from bench.engine.guided import run_guided_bench

    result = run_guided_bench(results["build"].ref.engine_dir, results["prepare"].ref.path, quick=args.quick, progress=dim_lines(status))
    out = args.out or store.build_dir / GUIDED_RESULT_NAME
    write_and_print(result, out, True, str, status)  # the guided figures print as JSON only
    status.print(f"wrote {out}")
    return 0
