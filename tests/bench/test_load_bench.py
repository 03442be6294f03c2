"""The load benchmark's workload, table, plot and CLI argument errors (no server needed)."""

from __future__ import annotations

import json
import random

import pytest

from pipeline.cli import main
from pipeline.errors import SpecError
from pipeline.load.report import plot_sweep, render_load_markdown
from pipeline.load.sweep import openai_overhead
from pipeline.load.workload import LengthDist, TextTokenizer, file_requests, synthetic_requests
from tests.conftest import REPO

TOKENIZER_DIR = REPO / "models" / "tiny-stdlib-llama"


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer(TOKENIZER_DIR)


def test_synthetic_prompts_have_about_the_asked_length_and_are_seeded(tokenizer):
    make = lambda seed: synthetic_requests(  # noqa: E731
        tokenizer, 20, input_tokens=LengthDist(48, 8), output_tokens=LengthDist(16), max_input_len=256, max_output_len=64, seed=seed
    )
    requests = make(0)
    assert requests == make(0) and requests != make(1)
    lengths = [request.input_tokens for request in requests]
    assert 40 <= sum(lengths) / len(lengths) <= 56
    assert all(request.max_tokens == 16 and request.exact_output for request in requests)


def test_lengths_are_clipped_to_what_the_engine_takes():
    rng = random.Random(0)
    assert {LengthDist(100, 500).sample(rng, 64) for _ in range(200)} <= set(range(1, 65))
    with pytest.raises(ValueError, match="mean must be >= 1"):
        LengthDist(0)


def test_prompts_from_files(tmp_path):
    text = tmp_path / "prompts.txt"
    text.write_text("def f(x):\n\nclass A:\n")
    requests = file_requests(text, output_tokens=LengthDist(8), max_output_len=100)
    assert [(r.prompt, r.max_tokens) for r in requests] == [("def f(x):", 8), ("class A:", 8)]
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text('{"prompt": "import os", "max_tokens": 3}\n{"prompt": "x = "}\n')
    assert [(r.prompt, r.max_tokens) for r in file_requests(jsonl, output_tokens=LengthDist(5), max_output_len=100)] == [("import os", 3), ("x = ", 5)]


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "prompts.jsonl:1: not a JSON line"),
        ('{"text": "x"}', 'expected an object with a "prompt" string'),
        ('{"prompt": "x", "max_tokens": 0}', "max_tokens must be a positive integer, got 0"),
    ],
)
def test_bad_prompt_files_name_the_line(tmp_path, line, message):
    path = tmp_path / "prompts.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(SpecError, match=message):
        file_requests(path, output_tokens=LengthDist(5), max_output_len=100)


def test_an_empty_prompt_file_is_refused(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n\n")
    with pytest.raises(SpecError, match="no prompts in it"):
        file_requests(path, output_tokens=LengthDist(5), max_output_len=100)


def sweep_point(endpoint: str, concurrency: int, ttft: float, throughput: float) -> dict:
    dist = lambda base: {"p50": base, "p90": base * 1.2, "p99": base * 1.5}  # noqa: E731
    return {
        "endpoint": endpoint,
        "label": f"{endpoint} c{concurrency}",
        "mode": {"concurrency": concurrency},
        "requests": 8,
        "completed": 8,
        "failed": 0,
        "errors": {},
        "requests_per_s": throughput / 16,
        "output_tokens_per_s": throughput,
        "ttft_ms": dist(ttft),
        "itl_ms": dist(5.0),
        "e2e_ms": dist(ttft + 80),
        "goodput_requests_per_s": throughput / 16,
    }


def sweep() -> dict:
    points = [
        sweep_point("grpc", 1, 20.0, 150.0),
        sweep_point("openai", 1, 23.0, 140.0),
        sweep_point("grpc", 4, 30.0, 330.0),
        sweep_point("openai", 4, 35.0, 300.0),
    ]
    return {
        "started_at": "2026-11-29T00:00:00+00:00",
        "recipe": {"workload": "w", "requests_per_point": 8, "warmup": 1, "slo": {}},
        "points": points,
        "overhead": openai_overhead(points),
    }


def test_openai_overhead_is_the_difference_at_the_same_load():
    rows = openai_overhead(sweep()["points"])
    assert rows[0] == {
        "mode": "concurrency=1",
        "ttft_p50_ms_added": 3.0,
        "e2e_p50_ms_added": 3.0,
        "itl_p50_ms_added": 0.0,
        "throughput_ratio": round(140 / 150, 4),
    }
    assert len(rows) == 2


def test_markdown_table_and_plot(tmp_path):
    result = sweep()
    table = render_load_markdown(result)
    assert "| grpc | concurrency=4 | 8 | 0 |" in table and "OpenAI front end vs Triton gRPC" in table
    png = plot_sweep(result, tmp_path / "sweep.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    json.dumps(result)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--concurrency", "0,2"], "expected integers >= 1"),
        (["--request-rate", "fast"], "expected comma-separated numbers"),
        (["--endpoint", "grpc,kafka"], "endpoints are grpc, http, openai"),
        (["--duration", "-1"], "expected a number > 0"),
    ],
)
def test_bad_bench_arguments_exit_2_with_the_reason(argv, message, capsys, tmp_path):
    try:
        code = main(["--artifacts", str(tmp_path), "bench", "load", str(REPO / "build_configs/tiny-cpu.yaml"), *argv])
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_url_with_several_endpoints_is_refused(capsys, tmp_path):
    code = main(["--artifacts", str(tmp_path), "bench", "load", str(REPO / "build_configs/tiny-cpu.yaml"), "--url", "127.0.0.1:1", "--endpoint", "grpc,http"])
    assert code == 2 and "--url measures one endpoint" in capsys.readouterr().err
