"""Quantized builds end to end: quantize → build → accuracy gate → package → serve → infer (real tritonserver)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from clients import TritonLLMClient
from pipeline.config.spec import DeploySpec
from pipeline.serve import ServerOptions
from refengine import LLMEngine, SamplingParams
from tests.support.serving import SHUTDOWN_TIMEOUT_S, build_and_package, free_ports, running_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = "def __init__(self"
MAX_TOKENS = 24
# A smaller calibration and gate than the shipped configs (AWQ's search costs time per sample):
# the test checks that every stage runs and serves; BENCHMARKS.md measures the shipped settings.
QUICK = ("quantize.calibration.num_samples=8", "quantize.calibration.max_seq_len=128", "gate.accuracy.num_windows=4")


@pytest.mark.parametrize("config", ["tiny-cpu-fp8", "tiny-cpu-int4-awq"])
def test_quantized_config_serves_the_engines_greedy_output(config: str, tmp_path: Path) -> None:
    artifacts = build_and_package(config, tmp_path / "artifacts", overrides=QUICK)
    [gate] = (tmp_path / "artifacts" / config).glob("gate-*")
    assert (gate / "accuracy.json").is_file()

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(str(artifacts["tokenizer"]), local_files_only=True)
    engine = LLMEngine.from_engine_dir(artifacts["engine"])
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    [expected] = engine.generate([prompt_ids], SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, end_id=tokenizer.eos_token_id))
    expected_text = tokenizer.decode(list(expected.outputs[0].token_ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    http_port, grpc_port, metrics_port = free_ports(3)
    options = ServerOptions.from_deploy(
        DeploySpec(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port), artifacts["repository"], exit_timeout_secs=SHUTDOWN_TIMEOUT_S
    )
    # running_server checks the clean exit: the clients' connections are all closed (tritonserver
    # otherwise waits its exit timeout for them and exits 1), nothing is left in flight or leaked.
    with running_server(options, tmp_path / "serve"):
        for protocol, url in (("grpc", options.grpc_url), ("http", options.http_url)):
            with TritonLLMClient(url, protocol, timeout=60) as client:
                assert client.generate(PROMPT, max_tokens=MAX_TOKENS).text == expected_text, protocol
                with client.stream(PROMPT, max_tokens=MAX_TOKENS) as stream:
                    assert "".join(stream) == expected_text, protocol
