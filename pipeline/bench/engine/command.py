"""`trtllm-pipeline bench engine CONFIG`: arguments and command of the engine benchmark (bench.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.bench.command_support import BuildCpuTarget, build_for_bench, dim_lines, status_console

RESULT_NAME = "bench-engine.json"
HELP = "refengine inflight vs static batching vs transformers, KV utilisation, prefix reuse"
CONFIG_HELP = "build config YAML (target cpu)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a small workload (seconds, for smoke tests)")
    parser.add_argument("--requests", type=int, default=128, help="number of requests (default 128)")
    parser.add_argument("--kv-sharing", action="store_true", help="only the KV blocks of beam search and n > 1 sampling vs independent requests")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of tables")
    parser.add_argument("--out", type=Path, help=f"also write the JSON result here (default: <artifacts>/<name>/{RESULT_NAME})")


def run_engine_command(args: argparse.Namespace, build_cpu_target: BuildCpuTarget) -> int:
    from pipeline.bench.engine.bench import EngineBenchOptions, run_engine_bench
    from pipeline.bench.engine.report import render_markdown
    from pipeline.stages.build import ENGINE_DIR
    from pipeline.stages.prepare import checkpoint_dir

    _, store, results = build_for_bench(args, build_cpu_target, "bench engine", "build")
    status = status_console()
    if args.kv_sharing:
        from pipeline.bench.engine.sharing import run_kv_sharing

        return _report(args, status, store.build_dir / "bench-kv-sharing.json", run_kv_sharing(results["build"].ref.path / ENGINE_DIR), None)
    result = run_engine_bench(
        results["build"].ref.path / ENGINE_DIR,
        checkpoint_dir(results["prepare"].ref.path),
        EngineBenchOptions(num_requests=args.requests, quick=args.quick),
        progress=dim_lines(status),
    )
    return _report(args, status, store.build_dir / RESULT_NAME, result, render_markdown)


def _report(args: argparse.Namespace, status, default_out: Path, result: dict, render) -> int:
    out = args.out or default_out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    if args.json or render is None:
        print(json.dumps(result, indent=1, sort_keys=True))
    else:
        print(render(result))
    if not args.json:
        status.print(f"wrote {out}")
    return 0
