"""`run_serve_bench` against the real tritonserver, with a handful of requests (no timing asserts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.overhead.bench import SINGLE_TOKEN_PATHS, STREAM_PATHS, OverheadOptions, run_serve_bench
from bench.overhead.report import render_serve_markdown
from pipeline.config.spec import DeploySpec
from pipeline.serve import leaks

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def package(tiny_cpu) -> dict[str, Path]:
    """The session's shared build of the default config (read only: the bench serves a copy in its own workspace)."""
    return {"repo": tiny_cpu["repository"], "engine": tiny_cpu["engine"], "tokenizer": tiny_cpu["tokenizer"]}


def _quick(package, **overrides) -> dict:
    lines: list[str] = []
    settings = dict(requests=4, warmup=1, stream_tokens=8, stream_requests=2, stream_warmup=1, rounds=2, stream_rounds=2)
    settings.update(overrides)
    # The deploy spec's ports are the defaults (8000-8002); the bench must not use them.
    options = OverheadOptions(**settings)
    result = run_serve_bench(package["repo"], package["engine"], package["tokenizer"], DeploySpec(), options, progress=lines.append)
    assert lines and any("ready" in line for line in lines)
    return result


def _assert_stopped_cleanly(result: dict) -> None:
    checks = result["checks"]
    assert checks["server_exit_code"] == 0
    assert checks["server_process_group_left"] is False
    server = result["recipe"]["server"]
    assert not list(leaks.SHM_DIR.glob(f"{server['shm_prefix']}*")), "shared-memory regions left behind"
    assert set(server["ports"].values()).isdisjoint({8000, 8001, 8002})
    assert server["bind_address"] == "127.0.0.1"


def test_quick_run_returns_sane_fields(package):
    result = _quick(package)
    assert json.loads(json.dumps(result)) == result  # JSON-serialisable as it is
    _assert_stopped_cleanly(result)
    assert result["checks"]["texts_match_in_process"], result["checks"]["mismatches"]

    recipe = result["recipe"]
    assert recipe["counts"]["requests"] == 4 and recipe["counts"]["stream_tokens"] == 8
    assert recipe["versions"]["tritonserver"] and recipe["versions"]["tritonclient"] and recipe["versions"]["torch"]
    assert recipe["machine"]["cpu_count"] >= 1 and recipe["prompt_tokens"] > 0
    assert recipe["torch_threads"]["this_process"] == 1
    assert "run_serve_bench(" in recipe["call"]

    single = result["single_token"]
    assert single["baseline"] == "inprocess"
    assert [row["path"] for row in single["rows"]] == [path.name for path in SINGLE_TOKEN_PATHS]
    for row in single["rows"]:
        assert row["requests"] == 4 and row["callers"] == 1
        assert len(row["rounds_wall_s"]) == 2
        latency = row["latency_ms"]
        assert 0 < latency["min"] <= latency["p50"] <= latency["p99"] <= latency["max"]
        assert row["requests_per_s"] > 0 and row["p50_vs_baseline"] > 0
        assert row["texts_match_in_process"] and row["responses_per_request"] == 1
        if row["protocol"] == "in_process":
            assert row["server_cpu_ms_per_request"] is None
        else:
            assert row["server_cpu_ms_per_request"] >= 0
    assert single["rows"][0]["p50_vs_baseline"] == 1.0

    streaming = result["streaming"]
    assert streaming["tokens"] == 8
    rows = {row["path"]: row for row in streaming["rows"]}
    assert list(rows) == [path.name for path in STREAM_PATHS]
    for _name, row in rows.items():
        assert row["requests"] == 2 and row["per_token_ms"] > 0
        assert row["texts_match_in_process"]
        if row["stream"]:
            assert row["responses_per_request"] == 8  # one response per token
            assert 0 < row["ttft_ms"]["p50"] <= row["latency_ms"]["max"]
            assert row["inter_response_ms"]["min"] >= 0
        else:
            assert row["responses_per_request"] == 1 and "ttft_ms" not in row
    assert rows["grpc_ensemble_streamed"]["streamed_vs_non_streamed"] > 0
    assert rows["grpc_ensemble_streamed"]["marginal_per_token_ms"] is not None

    table = render_serve_markdown(result)
    assert "| ensemble, HTTP `/generate` |" in table and "| ensemble, gRPC, `stream=true` |" in table
    assert "Every answer equal to the in-process text: yes" in table
    _assert_breakdown(result, table)


def _assert_breakdown(result: dict, table: str) -> None:
    """Part (3): the server's CPU by process and Triton's per-model statistics, per served path."""
    single = {row["path"]: row for row in result["single_token"]["rows"]}
    assert single["inprocess"]["server_cpu_ms_per_request_by_process"] is None
    by_process = single["grpc_ensemble"]["server_cpu_ms_per_request_by_process"]
    assert {"tritonserver", "preprocessing", "tensorrt_llm", "postprocessing"} <= set(by_process)
    assert sum(by_process.values()) == pytest.approx(single["grpc_ensemble"]["server_cpu_ms_per_request"], abs=0.01)
    stats = single["grpc_ensemble"]["model_stats_per_request"]
    assert [model for model in stats] == ["ensemble", "preprocessing", "tensorrt_llm", "postprocessing"]
    for model in ("preprocessing", "tensorrt_llm", "postprocessing"):
        assert stats[model]["requests_per_request"] == 1 and stats[model]["compute_infer_us"] > 0
    # the BLS decodes its deltas itself (its tokenizer_dir): it calls preprocessing and tensorrt_llm, not postprocessing
    assert set(single["grpc_bls"]["model_stats_per_request"]) == {"preprocessing", "tensorrt_llm", "tensorrt_llm_bls"}
    streamed = {row["path"]: row for row in result["streaming"]["rows"]}["grpc_ensemble_streamed"]["model_stats_per_request"]
    # once per streamed token (a call still being recorded after the settling wait lands in the next round)
    assert streamed["postprocessing"]["requests_per_request"] == pytest.approx(8, abs=0.5)
    assert "(3) Where the server's time goes" in table and "| (2) | ensemble, gRPC, `stream=true` |" in table


def test_concurrent_callers_without_bls(package):
    result = _quick(package, concurrency=2, include_bls=False, requests=6, rounds=1, stream_rounds=1, stream_requests=1, sweep=(1, 3), sweep_requests=2)
    _assert_stopped_cleanly(result)
    assert result["checks"]["texts_match_in_process"], result["checks"]["mismatches"]
    rows = {row["path"]: row for row in result["single_token"]["rows"]}
    assert result["single_token"]["baseline"] == "inprocess_loop"
    assert not any(row["model"] == "tensorrt_llm_bls" for row in result["single_token"]["rows"] + result["streaming"]["rows"])
    assert rows["inprocess"]["callers"] == 1 and rows["grpc_ensemble"]["callers"] == 2 and rows["inprocess_loop"]["callers"] == 2
    assert all(row["requests"] == 6 for row in rows.values())
    sweep = result["sweep"]["rows"]  # part (4): 2 and 3 x 2 requests per path (two per caller), no BLS
    assert [(row["callers"], row["path"]) for row in sweep] == [
        (callers, path) for callers in (1, 3) for path in ("inprocess_loop_streamed", "grpc_ensemble_streamed")
    ]
    assert [row["requests"] for row in sweep] == [2, 2, 6, 6]
    for row in sweep:
        assert row["texts_match_in_process"] and row["output_tokens_per_s"] > 0 and row["ttft_p50_ms"] > 0
        assert (row["server_cpu_ms_per_token"] is None) == (row["path"] == "inprocess_loop_streamed")
    assert "(4) Concurrency sweep" in render_serve_markdown(result)
