"""`trtllm-pipeline bench soak CONFIG`: arguments and command of the soak (soak/bench.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.command_support import BuildCpuTarget, build_for_bench, dim_lines, status_console
from pipeline.errors import SpecError, StageError

RESULT_NAME = "bench-soak.json"
HELP = "chaos traffic (streams over gRPC, HTTP SSE and OpenAI, a share cut by the client) for a while; exits 1 on a crash, a leak or a changed greedy answer"
CONFIG_HELP = "build config YAML (target cpu)"


def add_arguments(soak: argparse.ArgumentParser) -> None:
    soak.add_argument("--duration", type=float, default=600.0, metavar="S", help="send new requests for S seconds (default 600)")
    soak.add_argument("--requests", type=int, metavar="N", help="instead: send N requests")
    soak.add_argument("--concurrency", type=int, default=64, metavar="N", help="concurrent streams (default 64)")
    soak.add_argument("--cut-fraction", type=float, default=0.5, metavar="F", help="share of streams the client cuts (default 0.5)")
    soak.add_argument("--endpoints", default="grpc,http,openai", metavar="LIST", help="grpc, http, openai (default all three)")
    soak.add_argument(
        "--triton-models", default="ensemble,tensorrt_llm_bls", metavar="LIST", help="Triton models the gRPC and HTTP streams go to (default both)"
    )
    soak.add_argument("--openai-triton-model", metavar="NAME", help="the Triton model behind the OpenAI front end (default: the front end's own default route)")
    soak.add_argument(
        "--sample-interval", type=float, default=30.0, metavar="S", help="sample every process's memory, descriptors and threads each S seconds (default 30)"
    )
    soak.add_argument("--max-rss-slope", type=float, metavar="MB_PER_MIN", help="fail when a process's RSS rises faster than this after the warm-up")
    soak.add_argument("--max-tokens", default="16,200", metavar="LOW,HIGH", help="output length range (default 16,200)")
    soak.add_argument("--seed", type=int, default=0)
    soak.add_argument("--json", action="store_true", help="print the verdict as JSON")
    soak.add_argument("--out", type=Path, help=f"where to write the JSON verdict (default <artifacts>/<name>/{RESULT_NAME})")


def chaos_plan(args: argparse.Namespace):
    from clients.load.chaos import ChaosPlan

    try:
        low, high = (int(part) for part in args.max_tokens.split(","))
    except ValueError:
        raise SpecError(f"--max-tokens takes LOW,HIGH (integers), got {args.max_tokens!r}") from None
    if not args.sample_interval > 0:
        raise SpecError(f"--sample-interval must be > 0 s, got {args.sample_interval:g}")
    if not args.requests and args.duration > 0 and args.sample_interval > args.duration:
        raise SpecError(f"--sample-interval {args.sample_interval:g} s is longer than --duration {args.duration:g} s: no sample would fall inside the run")
    if args.max_rss_slope is not None and args.max_rss_slope < 0:
        raise SpecError(f"--max-rss-slope must be >= 0 MB/min, got {args.max_rss_slope:g}")
    try:
        return ChaosPlan(
            requests=args.requests,
            duration_s=None if args.requests else args.duration,
            concurrency=args.concurrency,
            cut_fraction=args.cut_fraction,
            endpoints=_names(args.endpoints),
            triton_models=_names(args.triton_models),
            max_tokens=(low, high),
            seed=args.seed,
        )
    except ValueError as error:
        raise SpecError(f"bench soak: {error}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def run_soak_command(args: argparse.Namespace, build_cpu_target: BuildCpuTarget) -> int:
    from bench.soak.bench import soak
    from clients.load.chaos import ChaosTargets
    from pipeline.load.serving import serving

    plan = chaos_plan(args)
    loaded, store, results = build_for_bench(args, build_cpu_target, "bench soak", "package")
    status = status_console()
    say = dim_lines(status)
    repository = results["package"].ref.repository_dir
    with serving(
        repository,
        loaded.spec.deploy,
        model_name=loaded.spec.name,
        openai="openai" in plan.endpoints,
        say=say,
        check_alive=False,
        openai_triton_model=args.openai_triton_model,
    ) as endpoints:
        server = endpoints.server
        targets = ChaosTargets(endpoints.url("grpc"), endpoints.url("http"), endpoints.openai, endpoints.model_name)
        verdict = soak(
            plan,
            targets,
            server_pid=server.pid,
            metrics_url=server.options.metrics_url,
            log_path=server.log_path,
            progress=say,
            sample_interval_s=args.sample_interval,
            max_rss_slope_mb_per_min=args.max_rss_slope,
        )
    verdict.problems += stop_problems(server)  # the block stopped the front end, then the server
    result = verdict.as_dict()
    out = args.out or store.build_dir / RESULT_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(json.dumps(result, indent=1, sort_keys=True) if args.json else render_soak(result))
    status.print(f"wrote {out}")
    if not verdict.ok:
        raise StageError("bench soak failed: " + "; ".join(verdict.problems))
    return 0


def stop_problems(server) -> list[str]:
    """A heap corrupted during the run can show only when the server stops (the allocator checks
    its chunks as threads exit): what its stop found."""
    returncode = server.stop()  # stopped already: its exit code
    problems = []
    if server.fatal_signal_at_stop:
        problems.append(f"the server crashed while stopping ({server.fatal_signal_at_stop}): its heap was corrupted during the run")
    elif returncode not in (0, None):
        problems.append(f"the server exited {returncode} when stopped")
    return problems


def render_soak(result: dict) -> str:
    traffic, before, after = result["traffic"], result["before"], result["after"]
    lines = [
        f"soak: {traffic['sent']} requests in {traffic['seconds']:.0f} s — {traffic['done']} done, {traffic['cut']} cut, {traffic['failed']} failed",
        "",
        "| | before | after |",
        "| --- | --- | --- |",
        f"| ready | {before['ready']} | {after['ready']} |",
        f"| KV blocks used / active requests | {before['kv_blocks_used']:g} / {before['active_requests']:g} | "
        f"{after['kv_blocks_used']:g} / {after['active_requests']:g} |",
        f"| tritonserver RSS (MB) | {before['server_rss_mb']:.0f} | {after['server_rss_mb']:.0f} |",
        f"| stubs RSS (MB), count | {before['stub_rss_mb']:.0f}, {len(before['stub_pids'])} | {after['stub_rss_mb']:.0f}, {len(after['stub_pids'])} |",
        f"| total RSS (MB) | {before['total_rss_mb']:.0f} | {after['total_rss_mb']:.0f} ({after['total_rss_mb'] - before['total_rss_mb']:+.0f}) |",
        f"| signals in the log | {len(before['signals'])} | {len(after['signals'])} |",
        f"| greedy answer | {result['greedy_before']!r} | {'same' if result['greedy_after'] == result['greedy_before'] else repr(result['greedy_after'])} |",
        "",
        *trend_lines(result["trends"]),
        "",
        "per route: " + ", ".join(f"{route} {c['done']}/{c['cut']}/{c['failed']}" for route, c in sorted(traffic["by_route"].items())) + " (done/cut/failed)",
        "verdict: " + ("ok" if result["ok"] else "FAILED — " + "; ".join(result["problems"])),
    ]
    return "\n".join(lines)


def trend_lines(found: list[dict]) -> list[str]:
    """Per process: RSS first -> last and its slope after the warm-up, descriptors and threads first -> last."""
    if not found:
        return []
    lines = [
        "| process | RSS MB first -> last | RSS / anon / shmem slope after warm-up (MB/min) | fds | threads |",
        "| --- | --- | --- | --- | --- |",
    ]
    for t in found:
        slopes = " / ".join("—" if t[key] is None else f"{t[key]:+.2f}" for key in ("rss_slope_mb_per_min", "anon_slope_mb_per_min", "shmem_slope_mb_per_min"))
        lines.append(
            f"| {t['name']} | {t['rss_first_mb']:.0f} -> {t['rss_last_mb']:.0f} | {slopes} | {t['fds_first']} -> {t['fds_last']} | "
            f"{t['threads_first']} -> {t['threads_last']} |"
        )
    return ["", *lines]
