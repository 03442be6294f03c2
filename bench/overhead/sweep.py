"""Part (4) of the overhead benchmark: a concurrency sweep of streamed requests, in the same
server sitting. At each point N callers (closed loop, one stream each) run the EngineLoop in
this process, the ensemble and the BLS model over gRPC streaming (interleaved rounds, as parts
(1) and (2)); each point's rows give output tokens/s, time to first token, the gap between
streamed responses, and CPU per output token: the server's (by process) and this process's."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from bench.overhead.paths import MeasuredPath
from bench.overhead.rounds import run_part

SWEEP_PATHS = (
    MeasuredPath("inprocess_loop_streamed", "in-process `EngineLoop`, streamed", "loop", None, True),
    MeasuredPath("grpc_ensemble_streamed", "ensemble, gRPC, `stream=true`", "grpc", "ensemble", True),
    MeasuredPath("grpc_bls_streamed", "BLS, gRPC, `stream=true`", "grpc", "tensorrt_llm_bls", True),
)


def requests_at(callers: int, minimum: int) -> int:
    """Requests per path at a point: at least `minimum`, and two per caller."""
    return max(minimum, 2 * callers)


def run_sweep(
    paths: Sequence[MeasuredPath],
    make_workers: Callable[..., list],
    points: Sequence[int],
    *,
    minimum_requests: int,
    rounds: int,
    **common: Any,
) -> dict[int, dict[str, Any]]:
    """Each point's tallies by path name; `make_workers(path, callers=N)` and `common` (`say` and
    the rest of `run_part`'s keywords) as parts (1) and (2)."""
    tallies = {}
    for callers in points:
        requests = requests_at(callers, minimum_requests)
        common["say"](f"(4) {callers} concurrent stream(s): {requests} requests per path")
        tallies[callers] = run_part(
            paths,
            functools.partial(make_workers, callers=callers),
            requests=requests,
            warmup=callers,
            rounds=rounds,
            title=f"(4) N={callers}",
            **common,
        )
    return tallies


def sweep_rows(paths: Sequence[MeasuredPath], tallies: dict[int, dict[str, Any]], tokens: int, expected: str, mismatches: list[str]) -> list[dict[str, Any]]:
    rows = []
    for callers, by_path in tallies.items():
        for path in paths:
            tally = by_path[path.name]
            count = len(tally.samples)
            output_tokens = count * tokens
            wrong = sum(sample.text != expected for sample in tally.samples)
            if wrong:
                mismatches.append(f"(4) N={callers} {path.name}: {wrong} texts differ from the in-process text")
            served = path.kind == "grpc"
            rows.append(
                {
                    "callers": callers,
                    "path": path.name,
                    "label": path.label,
                    "requests": count,
                    "output_tokens_per_s": round(output_tokens / sum(tally.round_wall), 1),
                    "ttft_p50_ms": round(statistics.median(sample.ttft for sample in tally.samples) * 1000.0, 2),
                    "gap_p50_ms": round(statistics.median(gap for sample in tally.samples for gap in sample.gaps) * 1000.0, 2),
                    "server_cpu_ms_per_token": round(tally.server_cpu * 1000.0 / output_tokens, 4) if served else None,
                    "server_cpu_ms_per_token_by_process": {
                        label: round(seconds * 1000.0 / output_tokens, 4) for label, seconds in sorted(tally.server_cpu_by_process.items())
                    }
                    if served
                    else None,
                    "client_cpu_ms_per_token": round(tally.client_cpu * 1000.0 / output_tokens, 4),
                    "total_cpu_ms_per_token": round((tally.server_cpu + tally.client_cpu) * 1000.0 / output_tokens, 4),
                    "texts_match_in_process": wrong == 0,
                }
            )
    return rows


def sweep_table(rows: list[dict[str, Any]], tokens: int) -> list[str]:
    if not rows:
        return []
    lines = [
        "",
        f"(4) Concurrency sweep, {tokens} streamed tokens per request, N callers each with one stream (closed loop). CPU per output "
        "token: the server's process group (tritonserver + stubs; in-process: none) and total (+ this process, which runs the "
        "in-process engine and the clients).",
        "",
        "| N | path | out tok/s | TTFT p50 ms | gap p50 ms | server CPU ms/token | "
        "of it tritonserver / tensorrt_llm / postprocessing / BLS | total CPU ms/token |",
        "|---:|---|---:|---:|---:|---:|---|---:|",
    ]
    for row in rows:
        by = row["server_cpu_ms_per_token_by_process"]
        split = " / ".join(f"{by.get(label, 0.0):.3f}" for label in ("tritonserver", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls")) if by else "–"
        server = f"{row['server_cpu_ms_per_token']:.3f}" if row["server_cpu_ms_per_token"] is not None else "–"
        lines.append(
            f"| {row['callers']} | {row['label']} | {row['output_tokens_per_s']:.1f} | {row['ttft_p50_ms']:.2f} | {row['gap_p50_ms']:.2f} | "
            f"{server} | {split} | {row['total_cpu_ms_per_token']:.3f} |"
        )
    return lines
