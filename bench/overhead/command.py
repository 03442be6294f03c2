"""`trtllm-pipeline bench overhead CONFIG`: arguments and command of the serving-overhead benchmark (bench.py)."""

from __future__ import annotations

import argparse
import json

from bench.command_support import BuildCpuTarget, build_for_bench, dim_lines, status_console
from pipeline.errors import SpecError

RESULT_NAME = "bench-serve.json"  # the name it had as `bench serve --overhead`
HELP = "what Triton adds per request: 1-token generate via HTTP/gRPC/in-process and the per-token cost of streaming"
CONFIG_HELP = "build config YAML (target cpu)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, help="1-token requests per path (default 200)")
    parser.add_argument("--warmup", type=int, help="warm-up requests per path (default 20)")
    parser.add_argument("--concurrency", help="concurrent callers per path, one value (default 1)")
    parser.add_argument("--sweep", help="also a concurrency sweep of streamed requests at these stream counts, comma-separated (e.g. 1,2,4,8,16,32)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of tables")


def single_concurrency(text: str | None) -> int:
    if text is None:
        return 1
    if not text.isdigit() or int(text) < 1:
        raise SpecError(f"--concurrency of the overhead benchmark takes one integer >= 1, got {text!r}")
    return int(text)


def sweep_points(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise SpecError(f"--sweep of the overhead benchmark takes comma-separated integers >= 1, got {text!r}")
    return tuple(int(part) for part in parts)


def run_overhead_command(args: argparse.Namespace, build_cpu_target: BuildCpuTarget) -> int:
    from bench.overhead.bench import OverheadOptions, run_serve_bench
    from bench.overhead.report import render_serve_markdown

    concurrency = single_concurrency(args.concurrency)  # before building: a typo should not cost a build
    sweep = sweep_points(getattr(args, "sweep", None))
    options = OverheadOptions(requests=args.requests or 200, warmup=20 if args.warmup is None else args.warmup, concurrency=concurrency, sweep=sweep)
    loaded, store, results = build_for_bench(args, build_cpu_target, "bench overhead", "package")
    status = status_console()
    result = run_serve_bench(
        results["package"].ref.repository_dir,
        results["build"].ref.engine_dir,
        results["prepare"].ref.path,
        loaded.spec.deploy,
        options,
        progress=dim_lines(status),
    )
    out = store.build_dir / RESULT_NAME
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(json.dumps(result, indent=1, sort_keys=True) if args.json else render_serve_markdown(result))
    status.print(f"wrote {out}")
    return 0
