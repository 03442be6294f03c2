"""Tables of the overhead benchmark's result."""

from __future__ import annotations

from typing import Any

from bench.overhead.sweep import sweep_table


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}"


def render_serve_markdown(result: dict[str, Any]) -> str:
    lines = _header(result["recipe"]) + _single_token_table(result) + _streaming_table(result) + breakdown_table(result)
    lines += sweep_table(result.get("sweep", {}).get("rows", []), result["streaming"]["tokens"]) + _checks(result)
    return "\n".join(lines)


def _header(recipe: dict[str, Any]) -> list[str]:
    versions = recipe["versions"]
    return [
        f"Run {recipe['started']} · {recipe['machine']['cpu']}, {recipe['machine']['cpu_count']} CPU cores (shared), "
        f"tritonserver {versions['tritonserver']} (nvidia-pytriton {versions['nvidia-pytriton']}), tritonclient {versions['tritonclient']}, "
        f"torch {versions['torch']} (intra-op threads: {recipe['torch_threads']['this_process']} in-process; "
        f"server stub: {recipe['torch_threads']['server_stub']}), "
        f"Python {versions['python']} · repo {versions.get('git_commit')}{' + uncommitted changes' if versions.get('git_uncommitted_changes') else ''} · "
        f"wall {recipe['wall_s']} s, server start-up {recipe['server']['startup_s']} s · "
        f"1-min load average {recipe['load_average_1min']['start']} → {recipe['load_average_1min']['end']}",
        "",
        f"Recipe: `{recipe['call']}`  ",
        f"Prompt {recipe['prompt']!r} ({recipe['prompt_tokens']} tokens), greedy. Engine: {recipe['engine']['scheduler_policy']}, "
        f"chunked context {recipe['engine']['enable_chunked_context']}, KV reuse {recipe['engine']['enable_prefix_caching']}, "
        f"{recipe['engine']['compute_dtype']}.",
    ]


def _single_token_table(result: dict[str, Any]) -> list[str]:
    counts = result["recipe"]["counts"]
    lines = [
        "",
        f"(1) 1-token generate: {counts['requests']} requests per path ({counts['warmup']} warm-up), {counts['concurrency']} caller(s), "
        f"{counts['rounds']} interleaved rounds. Ratios against `{result['single_token']['baseline']}`. "
        "CPU = server process group (tritonserver + stubs) + this process, per request.",
        "",
        "| path | req/s | p50 ms | p90 ms | p99 ms | p50 ÷ in-process | p99 ÷ in-process | in-process req/s ÷ this | "
        "p50 overhead ms | server CPU ms/req | total CPU ms/req | CPU ÷ in-process |",
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
    return lines


def _streaming_table(result: dict[str, Any]) -> list[str]:
    counts = result["recipe"]["counts"]
    n = result["streaming"]["tokens"]
    lines = [
        "",
        f"(2) {n} tokens per request: {counts['stream_requests']} requests per path ({counts['stream_warmup']} warm-up), one caller, "
        f"{counts['stream_rounds']} interleaved rounds. Per-token = p50 latency ÷ {n}; marginal = (p50 of {n} tokens − p50 of the "
        f"same path's 1-token request in (1)) ÷ {n - 1}; gaps = between consecutive streamed responses.",
        "",
        f"| path | p50 ms ({n} tok) | p99 ms | per-token ms | ÷ in-process | marginal ms/token | streamed ÷ non-streamed | "
        "streaming extra ms/token | TTFT p50 ms | gap p50 / p99 ms | responses/req | server CPU ms/token | total CPU ms/token | CPU ÷ in-process |",
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
    return lines


_STUBS = ("preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls")


def breakdown_table(result: dict[str, Any]) -> list[str]:
    """Per served path: the server's CPU by process (tritonserver, each model's stub) and Triton's
    per-model statistics (µs per client request), from parts (1) and (2)."""
    lines = [
        "",
        "(3) Where the server's time goes, per client request: CPU ms of each process of the server's group (from /proc; "
        "`tritonserver` = Triton core, ensemble scheduler and HTTP/gRPC front ends; each Python model's stub by its name) and "
        "Triton's statistics per model (`/v2/models/stats`: requests per client request, then queue / compute_input / "
        "compute_infer / compute_output µs; a decoupled model's compute_infer ends when `execute` returns).",
        "",
        "| part | path | CPU tritonserver | CPU preprocessing | CPU tensorrt_llm | CPU postprocessing | CPU BLS | "
        "Triton stats per model: req × (queue / input / infer / output µs) |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for part, key in (("(1)", "single_token"), ("(2)", "streaming")):
        for row in result[key]["rows"]:
            cpu = row.get("server_cpu_ms_per_request_by_process")
            if not cpu:
                continue
            stats = row.get("model_stats_per_request") or {}
            described = "; ".join(
                f"{model} {figures['requests_per_request']:g} × ({figures['queue_us']:g} / {figures['compute_input_us']:g} / "
                f"{figures['compute_infer_us']:g} / {figures['compute_output_us']:g})"
                for model, figures in stats.items()
            )
            cells = " | ".join(_f(cpu.get(label), 3) for label in ("tritonserver", *_STUBS))
            lines.append(f"| {part} | {row['label']} | {cells} | {described or '–'} |")
    return lines


def _checks(result: dict[str, Any]) -> list[str]:
    checks = result["checks"]
    reconnects = sum(row.get("http_reconnects") or 0 for part in ("single_token", "streaming") for row in result[part]["rows"])
    return [
        "",
        f"Every answer equal to the in-process text: {'yes' if checks['texts_match_in_process'] else 'NO: ' + '; '.join(checks['mismatches'])}. "
        f"Server exit code {checks['server_exit_code']}, process group left after stop: {checks['server_process_group_left']}. "
        f"HTTP keep-alive reconnects: {reconnects}.",
    ]
