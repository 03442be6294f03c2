"""The capacity bench's figures, from its measurements: one row per stream interval, concurrency and path (the
rounds summed), the saturation point of each path, what one instance of each Python model sustains, and this
project's Python models against NVIDIA's at the same points.

CPU per token is CPU-seconds over streamed tokens in the same windows. "The Python models" of a path are the
stubs it adds to the stand-in (preprocessing + postprocessing for an ensemble, preprocessing + the BLS); their
streamed tokens per CPU-second is the bench's efficiency figure. One instance of a model runs in one process and
executes on one thread (the BLS's request threads share one GIL), so it sustains at most one core:
1 / (its CPU-seconds per token) tokens/s, reached where it is the bottleneck and has a core of its own.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from bench.capacity.repository import BenchPath

SATURATED_BELOW = 0.9  # delivered ÷ offered under this: the path no longer keeps pace with the stand-in
KNEE_GAIN = 1.1  # at `max` rate: a point that adds less than 10 % of tokens/s over the previous one is saturation
STANDIN = "tensorrt_llm"
SERVER = "tritonserver"
NO_CPU_SEEN = "no CPU time seen in the measured windows (/proc counts whole ticks): measure longer windows (--window) or more rounds"
NO_TOKENS_STREAMED = "no tokens streamed in the measured windows (every round stalled)"


def rows(result: dict[str, Any], paths: Iterable[BenchPath], options) -> list[dict[str, Any]]:
    labels = {path.name: path for path in paths}
    groups: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    for entry in result["measurements"]:
        groups.setdefault((entry["stream_interval"], entry["concurrency"], entry["path"]), []).append(entry)
    out = []
    for (interval, concurrency, name), group in groups.items():
        entries = [entry for entry in group if "stalled" not in entry]
        stalls = [entry["stalled"] for entry in group if "stalled" in entry]
        window = sum(entry["window_s"] for entry in entries)
        tokens = sum(entry["tokens"] for entry in entries)
        cpu: dict[str, float] = {}
        for entry in entries:
            for label, seconds in entry["server_cpu_s"].items():
                cpu[label] = cpu.get(label, 0.0) + seconds
        per_token = {label: _ms(seconds, tokens) for label, seconds in sorted(cpu.items())}
        stubs = labels[name].stubs if name in labels else tuple(group[0]["stubs"])
        python_ms = _ms(sum(cpu.get(stub, 0.0) for stub in stubs), tokens)
        offered = options.offered_tokens_per_s(concurrency)
        rate = tokens / window if window else 0.0  # 0: every round stalled
        out.append(
            {
                "stream_interval": interval,
                "concurrency": concurrency,
                "path": name,
                "label": labels[name].label if name in labels else name,
                "tokens_per_s": round(rate, 1),
                "offered_tokens_per_s": offered,
                "delivered_fraction": round(rate / offered, 3) if offered else None,
                "cpu_ms_per_token": per_token,
                "python_models": list(stubs),
                "python_cpu_ms_per_token": python_ms,
                "python_tokens_per_cpu_s": round(1000.0 / python_ms, 1) if python_ms else None,
                "server_cpu_ms_per_token": _ms(sum(cpu.values()), tokens),
                "client_cpu_ms_per_token": _ms(sum(entry["client_cpu_s"] for entry in entries), tokens),
                "gap_p50_ms": _median(entry["gap_p50_ms"] for entry in entries),
                "ttft_p50_ms": _median(entry["ttft_p50_ms"] for entry in entries),
                "completed": sum(entry["completed"] for entry in entries),
                "texts_equal": sum(entry["texts_equal"] for entry in entries),
                "responses_per_request": _summed(entry.get("responses_per_request", {}) for entry in entries),
                "errors": [error for entry in entries for error in entry["errors"]][:5],
                "stalled": stalls,  # rounds in which the server stopped answering this path (then restarted)
            }
        )
    return sorted(out, key=lambda row: (row["stream_interval"], row["concurrency"], list(labels).index(row["path"]) if row["path"] in labels else 99))


def saturation(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per stream interval and path: the first point that no longer keeps pace (paced rate: delivered under 90 % of
    what the stand-in offers; `max`: under 10 % more tokens/s than the point before), or none."""
    found = []
    for key in sorted({(row["stream_interval"], row["path"]) for row in table}):
        points = sorted((row for row in table if (row["stream_interval"], row["path"]) == key and row["tokens_per_s"]), key=lambda row: row["concurrency"])
        if not points:
            continue
        at, previous = None, None
        for row in points:
            fraction = row["delivered_fraction"]
            if fraction is not None and fraction < SATURATED_BELOW:
                at = row
                break
            if fraction is None and previous is not None and row["tokens_per_s"] < KNEE_GAIN * previous["tokens_per_s"]:
                at = previous
                break
            previous = row
        found.append(
            {
                "stream_interval": key[0],
                "path": key[1],
                "saturated_at": at["concurrency"] if at else None,
                "tokens_per_s_there": at["tokens_per_s"] if at else None,
                "peak_tokens_per_s": max(row["tokens_per_s"] for row in points),
            }
        )
    return found


def per_instance(table: list[dict[str, Any]], max_tokens: int) -> list[dict[str, Any]]:
    """What one instance of each Python model sustains on a core of its own (1 / its CPU per token), read at the
    point where its path streamed the most tokens/s; preprocessing per request (one per `max_tokens` tokens).

    A model of a path that ran but whose CPU the windows did not show (/proc counts in 1/CLK_TCK ticks: a model
    that runs once per request, in a short window or on a loaded machine, can add none) is listed as not measured,
    with why: no figure rather than a guess or a silent gap."""
    wanted = (
        ("postprocessing", "ensemble", "tokens"),
        ("postprocessing_batched", "ensemble_batched", "tokens"),
        ("tensorrt_llm_bls", "bls", "tokens"),
        ("preprocessing", "ensemble", "requests"),
        ("floor_postprocessing", "floor", "tokens"),
        ("floor_postprocessing_batched", "floor_batched", "tokens"),
        ("nv_postprocessing", "nvidia", "tokens"),
        ("nv_preprocessing", "nvidia", "requests"),
    )
    found = []
    for interval in sorted({row["stream_interval"] for row in table}):
        for stub, path, unit in wanted:
            ran = [row for row in table if row["stream_interval"] == interval and row["path"] == path]
            points = [row for row in ran if row["cpu_ms_per_token"].get(stub)]
            if not ran:
                continue
            if not points:
                found.append(
                    {
                        "stream_interval": interval,
                        "model": stub,
                        "path": path,
                        "unit": f"{unit}/s",
                        "at_concurrency": None,
                        "cpu_ms_per_token": None,
                        "per_core": None,
                        "path_tokens_per_s_there": None,
                        "not_measured": NO_CPU_SEEN if any(row["tokens_per_s"] for row in ran) else NO_TOKENS_STREAMED,
                    }
                )
                continue
            best = max(points, key=lambda row: row["tokens_per_s"])
            per_token_ms = best["cpu_ms_per_token"][stub]
            per_core = 1000.0 / per_token_ms / (max_tokens if unit == "requests" else 1)
            found.append(
                {
                    "stream_interval": interval,
                    "model": stub,
                    "path": path,
                    "unit": f"{unit}/s",
                    "at_concurrency": best["concurrency"],
                    "cpu_ms_per_token": per_token_ms,
                    "per_core": round(per_core, 1),
                    "path_tokens_per_s_there": best["tokens_per_s"],
                }
            )
    return found


def against_nvidia(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At each point NVIDIA's models ran: streamed tokens per CPU-second of the Python models, ours ÷ NVIDIA's."""
    index = {(row["stream_interval"], row["concurrency"], row["path"]): row for row in table}
    out = []
    for (interval, concurrency, path), row in sorted(index.items()):
        if path != "nvidia" or not row["python_tokens_per_cpu_s"]:
            continue
        entry = {"stream_interval": interval, "concurrency": concurrency, "nvidia_tokens_per_cpu_s": row["python_tokens_per_cpu_s"]}
        for ours in ("ensemble", "ensemble_batched"):
            mine = index.get((interval, concurrency, ours))
            if mine and mine["python_tokens_per_cpu_s"]:
                entry[f"{ours}_tokens_per_cpu_s"] = mine["python_tokens_per_cpu_s"]
                entry[f"{ours}_vs_nvidia"] = round(mine["python_tokens_per_cpu_s"] / row["python_tokens_per_cpu_s"], 2)
        out.append(entry)
    return out


def _ms(seconds: float, tokens: int) -> float | None:
    return round(seconds * 1000.0 / tokens, 4) if tokens else None


def _summed(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for entry in counts:
        for key, value in entry.items():
            total[key] = total.get(key, 0) + value
    return dict(sorted(total.items(), key=lambda item: int(item[0])))


def _median(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return round(statistics.median(present), 2) if present else None
