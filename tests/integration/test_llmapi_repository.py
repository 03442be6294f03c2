"""The llmapi target's Triton repository (NVIDIA's llmapi layout) in the real bundled tritonserver, on a machine
without TensorRT-LLM: Triton parses its config.pbtxt, the Python backend loads the model code, and the model fails
exactly at `from tensorrt_llm import LLM` (the GPU image has the package; nothing else is missing)."""

from __future__ import annotations

from tests.integration.serving import REPO, SHUTDOWN_TIMEOUT_S, build_and_package, free_ports

CONFIG = "llama-3.1-8b-fp8-llmapi"


def test_the_repository_loads_up_to_the_missing_tensorrt_llm_package(tmp_path):
    from pipeline.serve import ServerOptions, TritonServer

    repository = build_and_package(CONFIG, tmp_path / "store", ("build.runner=dry-run",))["repository"]
    http_port, grpc_port, metrics_port = free_ports(3)
    options = ServerOptions(
        model_repository=repository, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
        exit_timeout_secs=SHUTDOWN_TIMEOUT_S, exit_on_error=False,  # stay up to report the model's state
    )
    triton = TritonServer(options, workspace=tmp_path / "server").start()
    try:
        states = triton.wait_until_ready(timeout=120, require_all_ready=False)
        log = triton.log_path.read_text(errors="replace")
    finally:
        returncode = triton.stop()
    [state] = states.values()
    assert (state.name, state.state) == ("tensorrt_llm", "UNAVAILABLE")
    # the one missing package, raised by the import line of initialize (model.yaml was read before it)
    assert state.reason.startswith("Internal: ModuleNotFoundError: No module named 'tensorrt_llm'")
    source = (REPO / "model_repo" / "python" / "tensorrt_llm_llmapi.py").read_text().splitlines()
    [line] = [number for number, text in enumerate(source, 1) if text.strip().startswith("from tensorrt_llm import LLM")]
    assert state.reason.rstrip().endswith(f"tensorrt_llm/1/model.py({line}): initialize")
    # config.pbtxt was accepted: Triton created the CPU instance its instance_group declares and ran the model code
    assert "TRITONBACKEND_ModelInstanceInitialize: tensorrt_llm_0_0 (CPU device 0)" in log
    assert "Invalid argument" not in log and "failed to parse" not in log.lower()
    assert returncode == 0
