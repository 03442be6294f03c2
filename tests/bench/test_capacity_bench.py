"""`bench capacity` (issue #34) without a server: the GPU-pace stand-in's pure part, the bench's refusals, how its
figures are derived, and NVIDIA's configs filled as fill_template.py would. tests/integration/test_capacity_bench.py
serves the stand-in."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.capacity import figures, nvidia
from bench.capacity.fleet import chunk_tokens
from bench.capacity.options import CapacityOptions, check_queue, checked_options, integer_list
from bench.capacity.report import render_capacity_markdown
from bench.capacity.repository import bench_paths
from pipeline.errors import SpecError

STANDIN = Path(__file__).resolve().parents[2] / "bench" / "capacity" / "standin"


@pytest.fixture
def gpu_pace(monkeypatch):
    monkeypatch.syspath_prepend(str(STANDIN))
    import gpu_pace

    yield gpu_pace
    sys.modules.pop("gpu_pace", None)


@pytest.mark.parametrize("text", ["0", "-5", "nan", "inf", "fast", ""])
def test_a_rate_of_zero_negative_or_nonsense_is_refused_naming_the_parameter(gpu_pace, text):
    with pytest.raises(ValueError, match="standin_tokens_per_s"):
        gpu_pace.parse_rate(text)


def test_a_rate_is_tokens_per_second_or_max(gpu_pace):
    assert gpu_pace.parse_rate("100") == 100.0 and gpu_pace.parse_rate(" MAX ") is None
    assert gpu_pace.due_after(10, 100.0) == pytest.approx(0.1) and gpu_pace.due_after(10, None) == 0.0


def _request(**arrays):
    base = {
        "input_ids": np.array([[5, 6, 7, 0]], dtype=np.int32),
        "input_lengths": np.array([[3]], dtype=np.int32),
        "request_output_len": np.array([[10]], dtype=np.int32),
        "streaming": np.array([[True]], dtype=np.bool_),
    }
    return {**base, **arrays}


def test_the_stand_in_answers_as_the_cpu_model_streams_first_token_then_every_nth(gpu_pace):
    [row] = gpu_pace.parse_rows(_request(), cycle=[11, 12, 13], decoupled=True, exclude_input_default=True)
    assert row.prompt_ids == (5, 6, 7) and len(row.output_ids) == 10
    assert row.output_ids == gpu_pace.output_ids((5, 6, 7), 10, [11, 12, 13])  # a client can know it in advance
    chunks = []
    while not row.finished:
        count = gpu_pace.next_chunk(row, 4)
        arrays = gpu_pace.response_arrays(row, count)
        assert arrays["output_ids"].shape == (1, 1, count) and arrays["sequence_length"].tolist() == [[count]]
        assert arrays["preceding_ids"][0, 0].tolist() == (list(row.prompt_ids) + list(row.output_ids[: row.sent]))[-gpu_pace.CONTEXT_TOKENS :]
        row.sent += count
        row.responses += 1
        chunks.append(count)
    assert chunks == [1, 4, 4, 1] == [chunk_tokens(index, 10, 4) for index in range(4)]  # the bench counts what it sends


def test_a_non_streamed_request_gets_one_response_with_or_without_its_prompt(gpu_pace):
    rows = gpu_pace.parse_rows(_request(streaming=np.array([[False]], dtype=np.bool_)), cycle=[11], decoupled=True, exclude_input_default=False)
    arrays = gpu_pace.response_arrays(rows[0], gpu_pace.next_chunk(rows[0], 4))
    assert arrays["output_ids"][0, 0].tolist() == [5, 6, 7] + [11] * 10 and arrays["preceding_ids"].size == 0


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("beam_width", 2, "beam_width: the GPU-pace stand-in generates one sequence"),
        ("num_return_sequences", 3, "num_return_sequences: the GPU-pace stand-in generates one sequence"),
        ("return_generation_logits", True, "return_generation_logits: the GPU-pace stand-in computes no logits"),
        ("request_output_len", 0, "request_output_len: must be at least 1"),
        ("input_lengths", 9, "input_lengths: 9 must be between 1 and the 4 tokens"),
    ],
)
def test_the_stand_in_refuses_what_it_does_not_do_by_name(gpu_pace, name, value, message):
    with pytest.raises(gpu_pace.StandinError, match=message):
        gpu_pace.parse_rows(_request(**{name: np.array([[value]])}), cycle=[1], decoupled=True, exclude_input_default=True)


def test_a_stop_request_and_batched_rows(gpu_pace):
    assert gpu_pace.parse_rows({"stop": np.array([[True]])}, cycle=[1], decoupled=True, exclude_input_default=True) is None
    two = _request(input_ids=np.array([[5, 6, 0, 0], [7, 8, 9, 0]], dtype=np.int32), input_lengths=np.array([[2], [3]], dtype=np.int32))
    rows = gpu_pace.parse_rows(two, cycle=[1, 2], decoupled=True, exclude_input_default=True)
    assert [row.batch_index for row in rows] == [0, 1] and rows[1].prompt_ids == (7, 8, 9)
    with pytest.raises(gpu_pace.StandinError, match="needs the model in decoupled mode"):
        gpu_pace.parse_rows(two, cycle=[1], decoupled=False, exclude_input_default=True)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rate": "0"}, "--rate 0: the stand-in's rate must be more than 0"),
        ({"rate": "-3"}, "--rate -3"),
        ({"rate": "quick"}, "--rate 'quick'"),
        ({"concurrency": (0, 8)}, "every point must be at least 1 stream"),
        ({"paths": ("ensemble", "mine")}, "--paths mine: unknown"),
        ({"paths": ("nvidia",)}, "--paths nvidia needs --nvidia-models"),
        ({"max_tokens": 1}, "--tokens must be at least 2"),
    ],
)
def test_the_bench_refuses_bad_options_before_building_anything(change, message):
    import dataclasses

    with pytest.raises(SpecError, match=message):
        checked_options(dataclasses.replace(CapacityOptions(), **change))


def test_a_concurrency_above_the_servers_queue_is_refused_not_left_to_hang():
    with pytest.raises(SpecError, match="--concurrency 128 exceeds serve.max_queue_size 64") as refused:
        check_queue(CapacityOptions(), 64)
    assert "serve.max_queue_size" in refused.value.hint
    check_queue(CapacityOptions(concurrency=(8, 64)), 64)
    check_queue(CapacityOptions(), 0)  # 0: unbounded
    with pytest.raises(SpecError, match="--concurrency '8,x'"):
        integer_list("8,x", "--concurrency")


def test_the_command_refuses_a_zero_rate_before_loading_the_config(tmp_path):
    from bench.capacity.command import run_capacity_command

    args = argparse.Namespace(
        config=tmp_path / "missing.yaml",
        overrides=[],
        artifacts=tmp_path,
        concurrency="8",
        stream_intervals="1",
        rate="0",
        tokens=64,
        rounds=1,
        window=1.0,
        warmup=0.0,
        nvidia_models=None,
        paths="",
        json=False,
    )
    with pytest.raises(SpecError, match="--rate 0"):
        run_capacity_command(args, build_cpu_target=lambda *a: pytest.fail("nothing is built"))


def _measurement(path, concurrency, tokens, cpu, stalled=False):
    entry = {"stream_interval": 1, "concurrency": concurrency, "round": 0, "path": path, "stubs": [], "window_s": 2.0}
    if stalled:
        return {**entry, "stalled": "FleetStalled: no response"}
    return {
        **entry,
        "tokens": tokens,
        "responses": tokens,
        "gap_p50_ms": 1.0,
        "ttft_p50_ms": 2.0,
        "completed": 4,
        "texts_equal": 4,
        "errors": [],
        "server_cpu_s": cpu,
        "client_cpu_s": 0.1,
    }


def test_figures_per_token_cpu_saturation_per_instance_and_the_ratio_to_nvidia():
    paths = bench_paths("ensemble", nvidia_models=True)
    options = CapacityOptions(rate="100")
    result = {
        "measurements": [
            _measurement("ensemble", 8, 1600, {"tritonserver": 0.4, "preprocessing": 0.02, "postprocessing": 0.2}),
            _measurement("ensemble", 32, 2000, {"tritonserver": 0.5, "preprocessing": 0.02, "postprocessing": 0.3}),
            _measurement("nvidia", 8, 1600, {"nv_preprocessing": 0.02, "nv_postprocessing": 0.1}),
            _measurement("bls", 8, 0, {}, stalled=True),
        ]
    }
    table = figures.rows(result, paths, options)
    ensemble_8 = next(row for row in table if row["path"] == "ensemble" and row["concurrency"] == 8)
    assert ensemble_8["tokens_per_s"] == 800.0 and ensemble_8["delivered_fraction"] == 1.0
    assert ensemble_8["python_cpu_ms_per_token"] == pytest.approx(0.1375) and ensemble_8["cpu_ms_per_token"]["tritonserver"] == 0.25
    assert next(row for row in table if row["path"] == "bls")["stalled"] == ["FleetStalled: no response"]
    [ensemble] = [entry for entry in figures.saturation(table) if entry["path"] == "ensemble"]
    assert ensemble["saturated_at"] == 32  # 1,000 tokens/s of 3,200 offered
    post = next(entry for entry in figures.per_instance(table, options.max_tokens) if entry["model"] == "postprocessing")
    assert post["at_concurrency"] == 32 and post["per_core"] == pytest.approx(1000 / 0.15, rel=1e-3)
    [against] = figures.against_nvidia(table)
    assert against["ensemble_vs_nvidia"] == pytest.approx(0.1375**-1 / (0.075**-1), rel=0.01)


def test_a_model_whose_cpu_the_windows_did_not_show_is_reported_not_measured():
    """/proc counts whole ticks: preprocessing, once per request, may add none in a short window on a loaded machine."""
    paths = bench_paths("ensemble", nvidia_models=False)
    options = CapacityOptions(rate="100", max_tokens=64)
    result = {
        "measurements": [
            {**_measurement("ensemble", 8, 1600, {"tritonserver": 0.4, "preprocessing": 0.0, "postprocessing": 0.2}), "responses_per_request": {"64": 20}},
            {
                **_measurement("ensemble", 8, 1200, {"tritonserver": 0.3, "preprocessing": 0.0, "postprocessing": 0.1}),
                "responses_per_request": {"64": 15, "63": 1},
            },
            _measurement("bls", 8, 0, {}, stalled=True),
        ]
    }
    table = figures.rows(result, paths, options)
    assert next(row for row in table if row["path"] == "ensemble")["responses_per_request"] == {"63": 1, "64": 35}
    found = {(entry["model"], entry["path"]): entry for entry in figures.per_instance(table, options.max_tokens)}
    assert set(found) == {("postprocessing", "ensemble"), ("preprocessing", "ensemble"), ("tensorrt_llm_bls", "bls")}
    assert found["postprocessing", "ensemble"]["per_core"] == pytest.approx(1000 / (0.3 * 1000 / 2800), rel=1e-3)
    assert found["preprocessing", "ensemble"]["per_core"] is None and found["preprocessing", "ensemble"]["cpu_ms_per_token"] is None
    assert found["preprocessing", "ensemble"]["not_measured"] == figures.NO_CPU_SEEN
    assert found["tensorrt_llm_bls", "bls"]["not_measured"] == figures.NO_TOKENS_STREAMED
    summary = {
        "recipe": {
            "started": "now",
            "cpu_count": 2,
            "load_average_1min": {"start": 1, "end": 1},
            "wall_s": 1,
            "sittings": [],
            "options": {"rate": "100", "max_tokens": 64, "rounds": 1, "warmup_s": 1, "window_s": 1},
        },
        "rows": table,
        "saturation": figures.saturation(table),
        "per_instance": list(found.values()),
        "against_nvidia": [],
    }
    table_text = render_capacity_markdown(summary)
    assert f"| 1 | preprocessing | ensemble | – | not measured: {figures.NO_CPU_SEEN} | – | – |" in table_text


def test_nvidias_config_is_filled_as_fill_template_would_and_renamed():
    text = 'name: "postprocessing"\nmax_batch_size: ${triton_max_batch_size}\nparameters { key: "tokenizer_dir" value: { string_value: "${tokenizer_dir}" } }\n'
    filled = nvidia.filled_config(text, "nv_postprocessing", {"triton_max_batch_size": "32", "tokenizer_dir": "/tok"}, "config.pbtxt")
    assert filled.startswith('name: "nv_postprocessing"') and "max_batch_size: 32" in filled and '"/tok"' in filled
    with pytest.raises(SpecError, match="placeholders the bench cannot fill: engine_dir"):
        nvidia.filled_config(text + "${engine_dir}", "x", {"triton_max_batch_size": "1", "tokenizer_dir": "/t"}, "config.pbtxt")


def test_missing_nvidia_models_are_named(tmp_path):
    with pytest.raises(SpecError, match="preprocessing/config.pbtxt and preprocessing/1/model.py are missing"):
        nvidia.install(tmp_path, tmp_path / "repo", tokenizer_dir="/t", max_batch_size=8)


def test_the_cli_refuses_a_concurrency_over_the_queue_with_exit_code_and_message(tmp_path, capsys):
    from pipeline.cli import main

    config = Path(__file__).resolve().parents[2] / "build_configs" / "tiny-cpu.yaml"
    code = main(["--artifacts", str(tmp_path), "bench", "capacity", str(config), "--set", "serve.max_queue_size=16", "--concurrency", "8,32"])
    assert code != 0
    assert "--concurrency 32 exceeds serve.max_queue_size 16" in capsys.readouterr().err
    assert not (tmp_path / "tiny-cpu").exists()  # refused before anything was built
