"""The overhead benchmark's rows: each measured path's figures, and its ratios against the
in-process baseline (and, for streaming, against the same path's 1-token request)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.overhead.paths import ONE_TOKEN_OF, MeasuredPath
from bench.overhead.rounds import ms_summary, result_row

# A streamed path and the same path with `stream=false`.
NON_STREAMED_OF = {"grpc_ensemble_streamed": "grpc_ensemble", "grpc_bls_streamed": "grpc_bls"}


def single_token_rows(
    paths: Sequence[MeasuredPath], tallies: dict[str, Any], expected: str, concurrency: int, mismatches: list[str]
) -> tuple[list[dict[str, Any]], str]:
    """Part (1)'s rows and the name of their baseline (the in-process path with as many callers)."""
    rows = []
    for path in paths:
        row = result_row(path, tallies[path.name], 1 if path.kind == "inprocess" else concurrency)
        _check_texts(row, tallies[path.name], expected, f"(1) {path.name}", mismatches)
        rows.append(row)
    baseline = "inprocess" if concurrency == 1 else "inprocess_loop"
    base = {row["path"]: row for row in rows}[baseline]
    for row in rows:
        row["p50_vs_baseline"] = round(row["latency_ms"]["p50"] / base["latency_ms"]["p50"], 3)
        row["p99_vs_baseline"] = round(row["latency_ms"]["p99"] / base["latency_ms"]["p99"], 3)
        row["throughput_baseline_over_this"] = round(base["requests_per_s"] / row["requests_per_s"], 3)
        row["p50_overhead_ms"] = round(row["latency_ms"]["p50"] - base["latency_ms"]["p50"], 3)
        row["total_cpu_vs_baseline"] = round(row["total_cpu_ms_per_request"] / base["total_cpu_ms_per_request"], 3)
    return rows, baseline


def streaming_rows(
    paths: Sequence[MeasuredPath],
    tallies: dict[str, Any],
    expected: str,
    tokens: int,
    single_rows: list[dict[str, Any]],
    mismatches: list[str],
) -> list[dict[str, Any]]:
    """Part (2)'s rows: per-token cost, its marginal cost over part (1), and what streaming adds."""
    one_token = {row["path"]: row for row in single_rows}
    rows = [_stream_row(path, tallies[path.name], expected, tokens, one_token, mismatches) for path in paths]
    by_name = {row["path"]: row for row in rows}
    inproc = by_name["inprocess"]
    for row in rows:
        row["per_token_vs_in_process"] = round(row["per_token_ms"] / inproc["per_token_ms"], 3)
        row["total_cpu_vs_in_process"] = round(row["total_cpu_ms_per_request"] / inproc["total_cpu_ms_per_request"], 3)
        partner = by_name.get(NON_STREAMED_OF.get(row["path"], ""))
        row["streamed_vs_non_streamed"] = round(row["latency_ms"]["p50"] / partner["latency_ms"]["p50"], 3) if partner else None
        if partner:
            row["streaming_extra_ms_per_token"] = round((row["latency_ms"]["p50"] - partner["latency_ms"]["p50"]) / tokens, 4)
    return rows


def _stream_row(path: MeasuredPath, tally: Any, expected: str, tokens: int, one_token: dict[str, dict[str, Any]], mismatches: list[str]) -> dict[str, Any]:
    row = result_row(path, tally, 1)
    _check_texts(row, tally, expected, f"(2) {path.name}", mismatches)
    p50 = row["latency_ms"]["p50"]
    row["per_token_ms"] = round(p50 / tokens, 4)
    one = ONE_TOKEN_OF.get(path.name)
    if one is not None and one in one_token:
        row["marginal_per_token_ms"] = round((p50 - one_token[one]["latency_ms"]["p50"]) / (tokens - 1), 4)
        row["one_token_path"] = one
    else:
        row["marginal_per_token_ms"] = None
        row["one_token_path"] = None
    if path.stream:
        row["ttft_ms"] = ms_summary([sample.ttft for sample in tally.samples])
        row["inter_response_ms"] = ms_summary([gap for sample in tally.samples for gap in sample.gaps])
    server_cpu = row["server_cpu_ms_per_request"]
    row["server_cpu_ms_per_token"] = round(server_cpu / tokens, 4) if server_cpu is not None else None
    row["total_cpu_ms_per_token"] = round(row["total_cpu_ms_per_request"] / tokens, 4)
    return row


def _check_texts(row: dict[str, Any], tally: Any, expected: str, where: str, mismatches: list[str]) -> None:
    wrong = sum(sample.text != expected for sample in tally.samples)
    row["texts_match_in_process"] = wrong == 0
    if wrong:
        mismatches.append(f"{where}: {wrong} texts differ from the in-process text")
