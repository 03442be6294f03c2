"""The engine target for real: build the default model with trtllm-build and serve it with Triton's
tensorrtllm backend. Needs CUDA, tensorrt_llm 1.2.x (trtllm-build) and a tritonserver with the
TensorRT-LLM backend on PATH (NVIDIA's tritonserver:<tag>-trtllm-python-py3 image); skipped
elsewhere. Written to run unchanged on such a host: `pytest -m gpu tests/gpu`."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from clients import TritonLLMClient
from tests.support.serving import CLI, REPO, free_ports

pytestmark = pytest.mark.gpu


def _missing() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if importlib.util.find_spec("tensorrt_llm") is None:
        return "tensorrt_llm is not installed"
    for tool in ("trtllm-build", "tritonserver"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    return None


@pytest.mark.skipif(_missing() is not None, reason=f"needs a GPU build host: {_missing()}")
def test_default_model_builds_and_serves_on_the_gpu(tmp_path: Path) -> None:
    config = tmp_path / "tiny-gpu.yaml"
    text = (REPO / "build_configs" / "tiny-cpu.yaml").read_text()
    text = text.replace("name: tiny-cpu", "name: tiny-gpu").replace("../models/tiny-stdlib-llama", str(REPO / "models" / "tiny-stdlib-llama"))
    text = text.replace("  target: cpu", "  target: engine\n  runner: local")
    config.write_text(text.replace("deploy:\n", "deploy:\n  gpus: [0]\n"))
    artifacts = tmp_path / "artifacts"
    subprocess.run([str(CLI), "--artifacts", str(artifacts), "run", str(config), "--until", "package"], check=True, timeout=1800)
    [engine] = artifacts.glob("tiny-gpu/build-*/engine")
    assert (engine / "rank0.engine").is_file()
    assert json.loads((engine / "config.json").read_text())["version"].startswith("1.2")
    [repository] = artifacts.glob("tiny-gpu/package-*/model_repository")

    http_port, grpc_port, metrics_port = free_ports(3)
    server = subprocess.Popen(
        [
            "tritonserver",
            f"--model-repository={repository}",
            f"--http-port={http_port}",
            f"--grpc-port={grpc_port}",
            f"--metrics-port={metrics_port}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
        ],
    )
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert server.poll() is None, "tritonserver exited during start-up"
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(1)
        with TritonLLMClient(f"127.0.0.1:{grpc_port}", "grpc", timeout=120) as client:
            completion = client.generate("def __init__(self", max_tokens=16)
            streamed = "".join(client.stream("def __init__(self", max_tokens=16))
        assert completion.text and streamed == completion.text
    finally:
        server.terminate()
        server.wait(timeout=120)
