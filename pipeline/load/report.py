"""The load benchmark's outputs besides JSON: a markdown table and a latency-vs-throughput plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

_COLUMNS = (
    ("endpoint", "endpoint"),
    ("mode", "load"),
    ("completed", "ok"),
    ("failed", "failed"),
    ("requests_per_s", "req/s"),
    ("output_tokens_per_s", "out tok/s"),
    ("ttft_ms.p50", "TTFT p50"),
    ("ttft_ms.p90", "TTFT p90"),
    ("ttft_ms.p99", "TTFT p99"),
    ("itl_ms.p50", "ITL p50"),
    ("itl_ms.p99", "ITL p99"),
    ("e2e_ms.p50", "e2e p50"),
    ("e2e_ms.p99", "e2e p99"),
    ("goodput_requests_per_s", "goodput req/s"),
)


def value_at(point: dict[str, Any], dotted: str) -> Any:
    value: Any = point
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _cell(key: str, value: Any) -> str:
    if key == "mode":
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items()))
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return "—" if value is None else str(value)


def render_load_markdown(result: dict[str, Any]) -> str:
    recipe = result.get("recipe", {})
    lines = [
        f"Load benchmark, {result['started_at']} — {recipe.get('workload', '')}; "
        f"{recipe.get('requests_per_point')} requests per point after {recipe.get('warmup')} warm-up; latencies in ms"
        + (f"; goodput SLO {recipe['slo']}" if recipe.get("slo") else ""),
        "",
        "| " + " | ".join(title for _, title in _COLUMNS) + " |",
        "|" + "---|" * len(_COLUMNS),
    ]
    for point in result["points"]:
        lines.append("| " + " | ".join(_cell(key, value_at(point, key)) for key, _ in _COLUMNS) + " |")
    if result.get("overhead"):
        lines += [
            "",
            "OpenAI front end vs Triton gRPC at the same load (ms added at p50; throughput ratio):",
            "",
            "| load | TTFT | ITL | e2e | throughput × |",
            "|---|---|---|---|---|",
        ]
        for row in result["overhead"]:
            lines.append(f"| {row['mode']} | {row['ttft_p50_ms_added']} | {row['itl_p50_ms_added']} | {row['e2e_p50_ms_added']} | {row['throughput_ratio']} |")
    errors = {error: count for point in result["points"] for error, count in point.get("errors", {}).items()}
    if errors:
        lines += ["", "Errors: " + "; ".join(f"{count}× {error}" for error, count in errors.items())]
    return "\n".join(lines)


def plot_sweep(result: dict[str, Any], path: Path) -> Path:
    """Latency (TTFT p50/p99, ITL p50, e2e p50) against output tokens/s, one line per endpoint,
    each point labelled with its load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("ttft_ms", "time to first token (ms)"), ("itl_ms", "inter-token latency (ms)"), ("e2e_ms", "end-to-end latency (ms)"))
    figure, axes = plt.subplots(1, len(panels), figsize=(15, 4.5), constrained_layout=True)
    endpoints = sorted({point["endpoint"] for point in result["points"]})
    for axis, (metric, title) in zip(axes, panels):
        for color, endpoint in enumerate(endpoints):
            points = [p for p in result["points"] if p["endpoint"] == endpoint and p.get(metric)]
            if not points:
                continue
            x = [p["output_tokens_per_s"] for p in points]
            for quantile, style in (("p50", "-o"), ("p99", "--x")):
                axis.plot(x, [p[metric][quantile] for p in points], style, color=f"C{color}", label=f"{endpoint} {quantile}")
            for p, xv in zip(points, x):
                axis.annotate(_short_mode(p["mode"]), (xv, p[metric]["p50"]), textcoords="offset points", xytext=(3, 3), fontsize=7)
        axis.set_xlabel("output tokens / s")
        axis.set_ylabel(title)
        axis.grid(True, alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
    figure.suptitle(f"latency vs throughput — {result.get('recipe', {}).get('workload', '')}", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _short_mode(mode: dict[str, Any]) -> str:
    if "concurrency" in mode:
        return f"c={mode['concurrency']}"
    return f"{mode.get('request_rate')}/s"
