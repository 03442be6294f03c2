"""`bench capacity`'s GPU-pace stand-in served by the real tritonserver (issue #34): a short run measures the paths
with every streamed text equal to what the stand-in's tokens decode to and every request answered in its pattern
(stream_interval 4: the first token alone, then 4 per response), what the windows measured or "not measured"; the
stand-in refuses a rate of 0 when it loads, naming the parameter, and ends a request on
TensorRT-LLM's `stop` with nothing left in flight."""

from __future__ import annotations

import math
import queue
import time
import urllib.request
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from bench.capacity import figures
from bench.capacity.bench import run_capacity_bench
from bench.capacity.command import batched_postprocessing_config
from bench.capacity.options import CapacityOptions, checked_options
from bench.capacity.report import render_capacity_markdown, summarize
from bench.capacity.repository import bench_paths, write_bench_repository
from pipeline.config.loader import load_config
from pipeline.errors import PipelineError
from tests.support.serving import REPO, infer_inputs, serving_repository

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def batched_config(tiny_cpu):
    loaded = load_config(REPO / "build_configs" / "tiny-cpu.yaml")
    return loaded, batched_postprocessing_config(loaded, tiny_cpu["engine"], tiny_cpu["tokenizer"])


def test_a_short_run_measures_each_path_with_the_texts_the_stand_in_decodes_to(tiny_cpu, batched_config):
    """What the run measured, not how fast: a rate, a CPU share or a latency seen in a 1.5 s window depends on how
    loaded the machine is (the figures are `bench capacity`'s output, BENCHMARKS.md). A model whose CPU the window did
    not show is reported as not measured, never as a figure."""
    loaded, batched = batched_config
    options = checked_options(
        CapacityOptions(
            concurrency=(4,),
            stream_intervals=(1, 4),
            rate="50",
            max_tokens=32,
            rounds=1,
            warmup_s=0.5,
            window_s=1.5,
            paths=("ensemble", "ensemble_batched"),
        )
    )
    paths = bench_paths("ensemble", nvidia_models=False, only=options.paths)
    result = run_capacity_bench(tiny_cpu["repository"], batched, tiny_cpu["tokenizer"], loaded.spec.deploy, options)
    summary = summarize(result, paths, options)
    rows = {(row["stream_interval"], row["path"]): row for row in summary["rows"]}
    assert set(rows) == {(1, "ensemble"), (1, "ensemble_batched"), (4, "ensemble"), (4, "ensemble_batched")}
    for row in rows.values():
        assert row["stalled"] == [] and row["errors"] == [], row
        assert row["completed"] > 0 and row["texts_equal"] == row["completed"], row
        # every request answered in the stand-in's pattern: the first token alone, then stream_interval tokens per response
        responses = 1 + math.ceil((options.max_tokens - 1) / row["stream_interval"])
        assert row["responses_per_request"] == {str(responses): row["completed"]}, row
        assert row["offered_tokens_per_s"] == 4 * 50.0 and row["tokens_per_s"] >= 0
    for entry in result["measurements"]:  # each path's window was measured, its models' processes read from /proc
        [path] = [path for path in paths if path.name == entry["path"]]
        assert entry["window_s"] > 0 and set(path.stubs) | {"tritonserver", "tensorrt_llm"} <= set(entry["server_cpu_s"]), entry
        assert all(seconds >= 0 for seconds in entry["server_cpu_s"].values()) and entry["client_cpu_s"] >= 0, entry
    instances = {(entry["stream_interval"], entry["model"]): entry for entry in summary["per_instance"]}
    assert set(instances) == {(interval, model) for interval in (1, 4) for model in ("postprocessing", "postprocessing_batched", "preprocessing")}
    for entry in instances.values():  # a figure from what the window saw, or none, saying why
        if entry["per_core"] is None:
            assert entry["cpu_ms_per_token"] is None and entry["not_measured"] == figures.NO_CPU_SEEN, entry
        else:
            per = options.max_tokens if entry["unit"] == "requests/s" else 1
            assert entry["per_core"] == pytest.approx(1000.0 / entry["cpu_ms_per_token"] / per, rel=0.01), entry
    assert "One instance on a core of its own" in render_capacity_markdown(summary)


def test_a_stand_in_with_a_rate_of_zero_refuses_to_load_naming_the_parameter(tiny_cpu, batched_config, tmp_path):
    repository = tmp_path / "model_repository"
    write_bench_repository(tiny_cpu["repository"], batched_config[1], repository, rate="0", stream_interval=1, tokenizer_dir=tiny_cpu["tokenizer"])
    with pytest.raises(PipelineError) as refused, serving_repository(repository, tmp_path / "serve"):
        pass
    assert "standin_tokens_per_s: '0' must be more than 0 tokens/s per request" in str(refused.value) + str(getattr(refused.value, "hint", ""))


def _active(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("nv_trt_llm_request_metrics") and 'request_type="active"' in line:
                return float(line.rpartition(" ")[2])
    raise AssertionError("the stand-in publishes no active-request gauge")


def _tokens(result) -> int:
    ids = result.as_numpy("output_ids")
    return 0 if ids is None else ids.size


def test_the_stand_in_ends_a_stopped_request_with_nothing_left_in_flight(tiny_cpu, batched_config, tmp_path):
    repository = tmp_path / "model_repository"
    write_bench_repository(
        tiny_cpu["repository"],
        batched_config[1],
        repository,
        rate="20",
        stream_interval=1,
        tokenizer_dir=tiny_cpu["tokenizer"],
        cancellation_check_period_ms=100,
    )
    with serving_repository(repository, tmp_path / "serve") as server:
        request_id = f"stopped-{uuid.uuid4().hex}"
        arrays = {
            "input_ids": np.array([[5, 6, 7]], dtype=np.int32),
            "input_lengths": np.array([[3]], dtype=np.int32),
            "request_output_len": np.array([[500]], dtype=np.int32),
            "streaming": np.array([[True]], dtype=np.bool_),
        }
        client = grpcclient.InferenceServerClient(server.options.grpc_url)
        responses: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer("tensorrt_llm", infer_inputs(arrays), request_id=request_id, enable_empty_final_response=True)
        tokens = 0
        for _ in range(3):
            result, error = responses.get(timeout=30)
            assert error is None, error
            tokens += _tokens(result)
        stop = {"stop": np.array([[True]]), "input_lengths": np.array([[0]], dtype=np.int32), "request_output_len": np.array([[1]], dtype=np.int32)}
        client.async_stream_infer("tensorrt_llm", infer_inputs(stop), request_id=request_id, enable_empty_final_response=True)
        finals = 0
        while finals < 2:  # the generation's and the stop request's
            result, error = responses.get(timeout=60)
            assert error is None, error
            tokens += _tokens(result)
            finals += result.get_response().parameters["triton_final_response"].bool_param
        # by what it sent, not by how soon: a loaded machine may take its time, the stand-in never sends more than asked
        assert 3 <= tokens < 500, f"{tokens} of the 500 tokens asked for: the stop did not end the request"
        client.stop_stream()
        client.close()
        deadline = time.monotonic() + 60
        while _active(server.options.metrics_url) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _active(server.options.metrics_url) == 0
