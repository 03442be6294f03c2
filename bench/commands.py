"""`trtllm-pipeline bench BENCHMARK`: one subcommand per benchmark, named for what it measures.

`bench serve` was the load sweep and `bench serve --overhead` the overhead benchmark; both still
run, after a note on stderr that names the command to use now.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.capacity import command as capacity
from bench.command_support import BuildCpuTarget, dim_lines, status_console
from bench.engine import command as engine
from bench.load import command as load
from bench.overhead import command as overhead
from bench.soak import command as soak
from bench.speculative import command as speculative

ACCURACY_HELP = "perplexity and next-token agreement of every quantization format vs the baseline"
KV_CLAMP_HELP = "FP8 KV-cache scales clamped to >= 1.0 vs raw: agreement with the unquantized model"


def add_bench_parser(sub: argparse._SubParsersAction, **defaults: Any) -> None:
    """The `bench` command and its benchmarks; `defaults` are set on the parsed arguments (e.g. the CLI's handler)."""
    bench = sub.add_parser("bench", help="benchmarks (print a table and write JSON)")
    bench.set_defaults(**defaults)
    benchmarks = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    for name, module in (("capacity", capacity), ("engine", engine), ("load", load), ("overhead", overhead), ("speculative", speculative)):
        module.add_arguments(_with_config(benchmarks, name, module.HELP, module.CONFIG_HELP))
    accuracy = benchmarks.add_parser("accuracy", help=ACCURACY_HELP, description=ACCURACY_HELP)
    accuracy.add_argument("config", type=Path, help="build config YAML with a gate.accuracy section (target cpu)")
    accuracy.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    kv_clamp = benchmarks.add_parser("kv-clamp", help=KV_CLAMP_HELP, description=KV_CLAMP_HELP)
    kv_clamp.add_argument("config", type=Path, help="build config YAML with quantize.calibration and gate.accuracy (target cpu)")
    kv_clamp.add_argument("--shrink", type=int, action="append", metavar="N", help="also rows with K/V N times smaller (power of two; default 64 and 512)")
    kv_clamp.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    soak.add_arguments(_with_config(benchmarks, "soak", soak.HELP, soak.CONFIG_HELP))
    serve = _with_config(benchmarks, "serve", "deprecated: now `bench load` (with --overhead: `bench overhead`)", load.CONFIG_HELP)
    serve.add_argument("--overhead", action="store_true", help="deprecated: now `bench overhead`; --requests, --warmup and --concurrency as there")
    load.add_arguments(serve)


def _with_config(benchmarks: argparse._SubParsersAction, name: str, help_text: str, config_help: str) -> argparse.ArgumentParser:
    parser = benchmarks.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("config", type=Path, help=config_help)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE", help="override a config field (repeatable)")
    return parser


def run_bench_command(args: argparse.Namespace, build_cpu_target: BuildCpuTarget) -> int:
    benchmark = args.bench_command
    if benchmark == "serve":
        benchmark = "overhead" if args.overhead else "load"
        old = "bench serve --overhead" if args.overhead else "bench serve"
        print(f"note: `{old}` is deprecated and will be removed; it runs `bench {benchmark}` now", file=sys.stderr, flush=True)
    if benchmark == "capacity":
        return capacity.run_capacity_command(args, build_cpu_target)
    if benchmark == "engine":
        return engine.run_engine_command(args, build_cpu_target)
    if benchmark == "load":
        return load.run_load_command(args)
    if benchmark == "overhead":
        return overhead.run_overhead_command(args, build_cpu_target)
    if benchmark == "soak":
        return soak.run_soak_command(args, build_cpu_target)
    if benchmark == "speculative":
        return speculative.run_speculative_command(args, build_cpu_target)
    if benchmark == "kv-clamp":
        return _run_kv_clamp(args)
    return _run_accuracy(args)


def _run_accuracy(args: argparse.Namespace) -> int:
    from bench.accuracy_bench import render_accuracy_markdown, run_accuracy_bench

    result = run_accuracy_bench(args.config, args.artifacts, progress=dim_lines(status_console()))
    print(json.dumps(result, indent=1) if args.json else render_accuracy_markdown(result))
    return 0


def _run_kv_clamp(args: argparse.Namespace) -> int:
    from bench.kv_clamp_bench import DEFAULT_SHRINKS, render_kv_clamp_markdown, run_kv_clamp_bench

    result = run_kv_clamp_bench(args.config, shrinks=args.shrink or DEFAULT_SHRINKS, progress=dim_lines(status_console()))
    print(json.dumps(result, indent=1) if args.json else render_kv_clamp_markdown(result))
    return 0
