"""`trtllm-pipeline bench load CONFIG`: arguments and command of the load sweep over the load-test
library (pipeline/load/)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.command_support import dim_lines, status_console
from pipeline.errors import SpecError

if TYPE_CHECKING:
    from clients.load import LoadRequest

RESULT_NAME = "bench-serve-load"  # the name it had as `bench serve`: scripts and docs read it
HELP = "load sweep: TTFT, ITL, throughput, goodput over a concurrency (or request-rate) sweep; JSON + PNG plot"
CONFIG_HELP = "build config YAML (target cpu, or any target with --url)"


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def _rate_list(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers (requests/s), got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected request rates > 0, got {text!r}")
    return values


def _endpoints(text: str) -> tuple[str, ...]:
    values = tuple(part.strip() for part in text.split(",") if part.strip())
    from clients.load import ENDPOINTS  # here, not at import: `validate` builds this parser and must stay light

    unknown = [value for value in values if value not in ENDPOINTS]
    if not values or unknown:
        raise argparse.ArgumentTypeError(f"endpoints are {', '.join(ENDPOINTS)} (comma-separated), got {text!r}")
    return values


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, help="requests per point (default 32)")
    parser.add_argument("--warmup", type=int, help="warm-up requests per point (default 4)")
    parser.add_argument("--concurrency", help="concurrent callers, comma-separated sweep (default 1,2,4,8)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of tables")
    load = parser.add_argument_group("load sweep")
    load.add_argument(
        "--endpoint",
        type=_endpoints,
        default=("grpc",),
        metavar="LIST",
        help="grpc, http and/or openai, comma-separated (default grpc); several are interleaved at each point",
    )
    load.add_argument(
        "--request-rate",
        type=_rate_list,
        default=(),
        metavar="LIST",
        help="open loop: arrivals per second, comma-separated (Poisson unless --constant-rate); replaces --concurrency",
    )
    load.add_argument("--constant-rate", action="store_true", help="evenly spaced arrivals instead of Poisson")
    load.add_argument("--duration", type=_positive_float, metavar="S", help="stop sending new requests of a point after S seconds")
    load.add_argument("--input-tokens", type=int, default=128, metavar="N", help="synthetic prompt length mean (default 128)")
    load.add_argument("--input-tokens-stddev", type=_non_negative_float, default=0.0, metavar="S")
    load.add_argument("--output-tokens", type=int, default=64, metavar="N", help="output length mean; each request generates exactly its length (default 64)")
    load.add_argument("--output-tokens-stddev", type=_non_negative_float, default=0.0, metavar="S")
    load.add_argument("--prompts", type=Path, metavar="FILE", help="prompts from a file: one per line, or .jsonl with prompt (and max_tokens)")
    load.add_argument("--slo-ttft-ms", type=_positive_float, metavar="MS", help="goodput: time-to-first-token limit")
    load.add_argument("--slo-itl-ms", type=_positive_float, metavar="MS", help="goodput: inter-token latency limit")
    load.add_argument("--slo-e2e-ms", type=_positive_float, metavar="MS", help="goodput: end-to-end latency limit")
    load.add_argument("--url", help="measure this running server instead of starting one (Triton host:port for grpc/http, base URL for openai)")
    load.add_argument(
        "--api-key-file",
        type=Path,
        metavar="FILE",
        help=("the openai endpoint sends the first key of FILE (default: of TRTLLM_PIPELINE_API_KEYS, if set); a front end started here asks for the keys"),
    )
    load.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    load.add_argument("--out", type=Path, help=f"directory for {RESULT_NAME}.json and .png (default <artifacts>/<name>/)")


def sweep_options(args: argparse.Namespace) -> Any:
    from clients.load import SloLimits
    from pipeline.load.sweep import SweepOptions

    try:
        concurrencies = _int_list(args.concurrency) if args.concurrency else (1, 2, 4, 8)
    except argparse.ArgumentTypeError as error:
        raise SpecError(f"--concurrency: {error}") from None
    if args.url and len(args.endpoint) != 1:
        raise SpecError(f"--url measures one endpoint; got --endpoint {','.join(args.endpoint)}")
    return SweepOptions(
        endpoints=args.endpoint,
        concurrencies=concurrencies,
        request_rates=args.request_rate,
        requests_per_point=args.requests or 32,
        warmup=4 if args.warmup is None else args.warmup,
        duration_s=args.duration,
        slo=SloLimits(ttft_ms=args.slo_ttft_ms, itl_ms=args.slo_itl_ms, e2e_ms=args.slo_e2e_ms),
        poisson=not args.constant_rate,
        seed=args.seed,
    )


def build_workload(args: argparse.Namespace, spec: Any, tokenizer_dir: Path, count: int) -> tuple[list[LoadRequest], str]:
    from pipeline.load.workload import LengthDist, TextTokenizer, file_requests, synthetic_requests

    try:
        output = LengthDist(args.output_tokens, args.output_tokens_stddev)
        inputs = LengthDist(args.input_tokens, args.input_tokens_stddev)
    except ValueError as error:
        raise SpecError(f"--input-tokens/--output-tokens: {error}") from None
    max_output = max(1, (spec.build.max_seq_len or 1 << 30) - spec.build.max_input_len)
    if args.prompts:
        requests = file_requests(args.prompts, output_tokens=output, max_output_len=max_output, seed=args.seed)
        return requests, f"{len(requests)} prompts from {args.prompts}, output {output.describe()} tokens"
    if inputs.mean > spec.build.max_input_len:
        raise SpecError(f"--input-tokens {inputs.mean} exceeds build.max_input_len {spec.build.max_input_len}")
    requests = synthetic_requests(
        TextTokenizer(tokenizer_dir),
        count,
        input_tokens=inputs,
        output_tokens=output,
        max_input_len=spec.build.max_input_len,
        max_output_len=max_output,
        seed=args.seed,
    )
    return requests, f"synthetic prompts of {inputs.describe()} tokens, output {output.describe()} tokens"


def progress_bar(console: Console) -> tuple[Progress, Any]:
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=False)
    tasks: dict[str, Any] = {}

    def update(label: str, done: int, total: int) -> None:
        if label not in tasks:
            tasks[label] = progress.add_task(label, total=total)
        progress.update(tasks[label], completed=done)

    return progress, update


def write_results(result: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    from pipeline.load.report import plot_sweep

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{RESULT_NAME}.json"
    json_path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return json_path, plot_sweep(result, out_dir / f"{RESULT_NAME}.png")


def run_load_command(args: argparse.Namespace) -> int:
    """Build (or reuse) the served repository, start what the sweep needs (unless --url), sweep,
    write JSON + plot, print the table (or JSON)."""
    from pipeline.artifacts import ArtifactStore, store_root
    from pipeline.backends.registry import backend_for
    from pipeline.config.loader import load_config
    from pipeline.load.remote import load_test_keys, remote_endpoints
    from pipeline.load.report import render_load_markdown
    from pipeline.load.serving import serving
    from pipeline.load.sweep import run_load_sweep
    from pipeline.runner import run_pipeline

    options = sweep_options(args)
    keys = load_test_keys(args.api_key_file) if "openai" in options.endpoints else None
    loaded = load_config(args.config, args.overrides)
    spec = loaded.spec
    store = ArtifactStore(store_root(args.artifacts, writable=True), spec.name)
    status = status_console()
    if args.url is None and not backend_for(spec.build.target).serves_here:
        raise SpecError(
            f"bench load starts the cpu target here; {loaded.path} has build.target {spec.build.target.value!r}: measure its running deployment with --url"
        )
    until = "prepare" if args.url else "package"
    results = {r.name: r for r in run_pipeline(loaded, store, until=until, console=status)}
    workload, description = build_workload(args, spec, results["prepare"].ref.path, options.requests_per_point)
    recipe = {"config": str(args.config), "build": spec.name, "target": spec.build.target.value, "workload": description}
    progress, update = progress_bar(status)
    say = dim_lines(status)
    with progress:
        if args.url:
            endpoints = remote_endpoints(spec, options.endpoints[0], args.url, api_key=keys[0].secret if keys else None)
            result = run_load_sweep(endpoints, workload, options, progress=update, recipe=recipe)
        else:
            repo = results["package"].ref.repository_dir
            with serving(repo, spec.deploy, model_name=spec.name, openai="openai" in options.endpoints, say=say, api_keys=keys) as endpoints:
                result = run_load_sweep(endpoints, workload, options, progress=update, recipe=recipe)
    json_path, plot_path = write_results(result, args.out or store.build_dir)
    print(json.dumps(result, indent=1, sort_keys=True) if args.json else render_load_markdown(result))
    status.print(f"wrote {json_path} and {plot_path}")
    failed = sum(point["failed"] for point in result["points"])
    if failed:
        status.print(f"[yellow]{failed} request(s) failed; see 'errors' in the results[/yellow]")
    return 0
