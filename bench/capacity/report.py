"""The capacity bench's tables (markdown), from `summarize`'s figures."""

from __future__ import annotations

from typing import Any

from bench.capacity import figures
from bench.capacity.repository import BenchPath


def summarize(result: dict[str, Any], paths: tuple[BenchPath, ...], options) -> dict[str, Any]:
    """The result with its figures added (rows, saturation, per-instance capacity, the comparison with NVIDIA)."""
    table = figures.rows(result, paths, options)
    return {
        **result,
        "rows": table,
        "saturation": figures.saturation(table),
        "per_instance": figures.per_instance(table, options.max_tokens),
        "against_nvidia": figures.against_nvidia(table),
    }


def render_capacity_markdown(summary: dict[str, Any]) -> str:
    recipe = summary["recipe"]
    options = recipe["options"]
    lines = [
        f"Run {recipe['started']} · {recipe['cpu_count']} CPU cores · 1-min load {recipe['load_average_1min']['start']} → "
        f"{recipe['load_average_1min']['end']} · wall {recipe['wall_s']} s · tritonserver "
        f"{', '.join(sorted({str(s['server_version']) for s in recipe['sittings']}))}",
        "",
        f"Stand-in: {options['rate']} tokens/s per request, {options['max_tokens']} tokens per request; {options['rounds']} rounds, "
        f"each path in a server of its own per round, each point {options['warmup_s']} s warm-up + {options['window_s']} s measured. "
        "CPU per streamed token from /proc (user + system) in the measured windows; Python models = the stubs the path adds to the stand-in.",
        "",
        "| interval | streams | path | tok/s | offered | delivered | Python models CPU ms/tok | tok per CPU-s | tritonserver ms/tok "
        "| stand-in ms/tok | by stub ms/tok | client ms/tok | gap p50 ms | texts equal |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for row in summary["rows"]:
        cpu = row["cpu_ms_per_token"]
        stubs = ", ".join(f"{stub} {cpu.get(stub, 0.0):.3f}" for stub in row["python_models"])
        offered = f"{row['offered_tokens_per_s']:,.0f}" if row["offered_tokens_per_s"] else "max"
        delivered = f"{row['delivered_fraction']:.2f}" if row["delivered_fraction"] is not None else "–"
        lines.append(
            f"| {row['stream_interval']} | {row['concurrency']} | {row['label']} | {row['tokens_per_s']:,.0f} | {offered} | {delivered} | "
            f"{_f(row['python_cpu_ms_per_token'])} | {_f(row['python_tokens_per_cpu_s'], 0)} | {_f(cpu.get(figures.SERVER))} | "
            f"{_f(cpu.get(figures.STANDIN))} | {stubs} | {_f(row['client_cpu_ms_per_token'])} | {_f(row['gap_p50_ms'], 1)} | "
            f"{row['texts_equal']}/{row['completed']}{' · stalled ' + str(len(row['stalled'])) + '×' if row['stalled'] else ''} |"
        )
    lines += [
        "",
        "Saturation (paced: delivered < 90 % of offered; max: < 10 % more tok/s than the point before):",
        "",
        "| interval | path | saturates at streams | tok/s there | peak tok/s |",
        "|---:|---|---:|---:|---:|",
    ]
    for entry in summary["saturation"]:
        at = entry["saturated_at"] if entry["saturated_at"] is not None else "not reached"
        lines.append(f"| {entry['stream_interval']} | {entry['path']} | {at} | {_f(entry['tokens_per_s_there'], 0)} | {entry['peak_tokens_per_s']:,.0f} |")
    lines += [
        "",
        "One instance on a core of its own (1 ÷ its CPU per token, at its path's busiest point):",
        "",
        "| interval | model | path | streams | CPU ms/token | per core | path tok/s there |",
        "|---:|---|---|---:|---:|---:|---:|",
    ]
    for entry in summary["per_instance"]:
        if entry.get("per_core") is None:
            lines.append(f"| {entry['stream_interval']} | {entry['model']} | {entry['path']} | – | not measured: {entry['not_measured']} | – | – |")
            continue
        lines.append(
            f"| {entry['stream_interval']} | {entry['model']} | {entry['path']} | {entry['at_concurrency']} | {entry['cpu_ms_per_token']:.4f} | "
            f"{entry['per_core']:,.0f} {entry['unit']} | {entry['path_tokens_per_s_there']:,.0f} |"
        )
    if summary["against_nvidia"]:
        lines += [
            "",
            "Streamed tokens per CPU-second of the Python models, this project's ÷ NVIDIA's (same stand-in, same server):",
            "",
            "| interval | streams | NVIDIA | ensemble | ÷ NVIDIA | ensemble, batched postprocessing | ÷ NVIDIA |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for entry in summary["against_nvidia"]:
            lines.append(
                f"| {entry['stream_interval']} | {entry['concurrency']} | {entry['nvidia_tokens_per_cpu_s']:,.0f} | "
                f"{_f(entry.get('ensemble_tokens_per_cpu_s'), 0)} | {_f(entry.get('ensemble_vs_nvidia'), 2)} | "
                f"{_f(entry.get('ensemble_batched_tokens_per_cpu_s'), 0)} | {_f(entry.get('ensemble_batched_vs_nvidia'), 2)} |"
            )
    errors = [f"{row['stream_interval']}/{row['concurrency']}/{row['path']}: {'; '.join(row['errors'])}" for row in summary["rows"] if row["errors"]]
    if errors:
        lines += ["", "Errors: " + " · ".join(errors)]
    stalls = [f"{row['stream_interval']}/{row['concurrency']}/{row['path']}: {row['stalled'][0]}" for row in summary["rows"] if row["stalled"]]
    if stalls:
        lines += ["", "Stalled (the server stopped answering the path; its round ended there): " + " · ".join(stalls)]
    return "\n".join(lines)


def _f(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"
