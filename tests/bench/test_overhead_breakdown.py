"""The overhead benchmark's breakdown helpers: Triton's per-model statistics as differences per
client request, the server's processes named by model, and `--sweep`'s argument."""

from __future__ import annotations

import sys

import pytest

from bench.overhead import model_stats
from bench.overhead.bench import add_error_note
from bench.overhead.command import sweep_points
from bench.overhead.rounds import _process_label
from pipeline.errors import SpecError


def _entry(name: str, requests: int, executions: int, ns: int) -> dict:
    phases = {phase: {"count": requests, "ns": ns * (index + 1)} for index, phase in enumerate(model_stats.PHASES)}
    return {"name": name, "execution_count": executions, "inference_stats": {"success": {"count": requests, "ns": 0}, **phases}}


def test_statistics_differences_per_client_request():
    before = {"postprocessing": model_stats._counters(_entry("postprocessing", 10, 10, 1_000))}
    after = {
        "postprocessing": model_stats._counters(_entry("postprocessing", 10 + 8, 10 + 4, 9_000)),
        "preprocessing": model_stats._counters(_entry("preprocessing", 2, 2, 4_000)),
        "idle": model_stats._counters(_entry("idle", 0, 0, 0)),
    }
    total: model_stats.Snapshot = {}
    model_stats.add_difference(total, before, after)
    model_stats.add_difference(total, {}, {})  # a round with nothing new
    rows = model_stats.per_request(total, client_requests=2)
    assert list(rows) == ["preprocessing", "postprocessing"]  # the pipeline's order; models that ran only
    assert rows["postprocessing"] == {
        "queue_us": 4.0,
        "compute_input_us": 8.0,
        "compute_infer_us": 12.0,
        "compute_output_us": 16.0,
        "requests_per_request": 4.0,
        "executions_per_request": 2.0,
    }
    assert rows["preprocessing"]["requests_per_request"] == 1.0 and rows["preprocessing"]["queue_us"] == 2.0


def test_server_processes_are_named_by_the_model_their_stub_runs():
    stub = [b"/opt/tritonserver/backends/python/triton_python_backend_stub", b"/tmp/repo/postprocessing/1/model.py", b"prefix", b""]
    assert _process_label(stub) == "postprocessing"
    assert _process_label([b"/x/bin/tritonserver", b"--model-repository", b"/tmp/repo"]) == "tritonserver"
    assert _process_label([]) == "?"


def test_sweep_points_are_positive_integers():
    assert sweep_points(None) == () and sweep_points("1,2, 32") == (1, 2, 32)
    for bad in ("0", "1,x", "2,,4"):
        with pytest.raises(SpecError, match="--sweep"):
            sweep_points(bad)


def test_error_notes_keep_the_servers_context_on_every_python(monkeypatch: pytest.MonkeyPatch) -> None:
    # found by mypy (python_version 3.10): BaseException.add_note is 3.11's, so on 3.10 the handler that keeps
    # tritonserver's log with a failed sitting raised AttributeError in place of the error it was handling
    said: list[str] = []
    error = RuntimeError("the sitting failed")
    add_error_note(error, "tritonserver was NOT running", said.append)
    assert error.__notes__ == ["tritonserver was NOT running"] and said == []
    monkeypatch.setattr(sys, "version_info", (3, 10, 14))
    older = RuntimeError("the sitting failed")
    add_error_note(older, "tritonserver was NOT running", said.append)
    assert not hasattr(older, "__notes__") and said == ["tritonserver was NOT running"]
