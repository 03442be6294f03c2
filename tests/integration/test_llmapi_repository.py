"""The llmapi target's Triton repository (NVIDIA's llmapi layout) in the real bundled tritonserver, on a machine
without TensorRT-LLM: Triton parses its config.pbtxt, the Python backend loads the model code, and the model fails
exactly at `from tensorrt_llm import LLM` (the GPU image has the package; nothing else is missing)."""

from __future__ import annotations

import json
import shutil

from tests.support.serving import REPO, SHUTDOWN_TIMEOUT_S, build_and_package, free_ports

CONFIG = "llama-3.1-8b-fp8-llmapi"


def test_the_repository_loads_up_to_the_missing_tensorrt_llm_package(tmp_path):
    from pipeline.serve import ServerOptions, TritonServer

    repository = build_and_package(CONFIG, tmp_path / "store", ("build.runner=dry-run",))["repository"]
    http_port, grpc_port, metrics_port = free_ports(3)
    options = ServerOptions(
        model_repository=repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        exit_timeout_secs=SHUTDOWN_TIMEOUT_S,
        exit_on_error=False,  # stay up to report the model's state
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


STANDIN = REPO / "tests" / "integration" / "llmapi_standin"


def _stream(port: int, body: dict) -> list[dict]:
    import httpx

    with httpx.stream("POST", f"http://127.0.0.1:{port}/v2/models/tensorrt_llm/generate_stream", json=body, timeout=30) as response:
        return [json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")]


def _serve_with_standin(tmp_path, overrides: tuple[str, ...]):
    from pipeline.serve import ServerOptions, TritonServer

    packaged = build_and_package(CONFIG, tmp_path / "store", ("build.runner=dry-run", *overrides))["repository"]
    repository = tmp_path / "repository"
    shutil.copytree(packaged, repository)
    # beside model.py: the Python backend puts the model's version directory on sys.path (as for its helper modules)
    shutil.copytree(STANDIN / "tensorrt_llm", repository / "tensorrt_llm" / "1" / "tensorrt_llm")
    http_port, grpc_port, metrics_port = free_ports(3)
    options = ServerOptions(
        model_repository=repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        exit_timeout_secs=SHUTDOWN_TIMEOUT_S,
    )
    return TritonServer(options, workspace=tmp_path / "server").start(), http_port


def test_the_model_code_serves_nvidias_contract_to_the_load_client_over_a_stand_in_llm(tmp_path):
    """Our model.py, for the first time past its import: LLM() is the stand-in package (tests/integration/
    llmapi_standin, copied beside model.py: no language, one word per step), everything else is real — the rendered repository, the bundled
    tritonserver's decoupled Python backend and HTTP generate_stream, and the load client of the llmapi contract
    (clients/load/llmapi_target.py, reached as `bench load --url` / gate.performance.url reach it)."""
    from clients.load import LoadRequest
    from clients.load.llmapi_target import LlmapiModelTarget
    from pipeline.config.loader import load_config
    from pipeline.load.remote import remote_endpoints
    from pipeline.load.sweep import SweepOptions, run_load_sweep

    triton, http_port = _serve_with_standin(tmp_path, ())
    try:
        states = triton.wait_until_ready(timeout=120)
        assert [(state.name, state.state) for state in states.values()] == [("tensorrt_llm", "READY")]
        spec = load_config(REPO / "build_configs" / f"{CONFIG}.yaml", ["build.runner=dry-run"]).spec
        endpoints = remote_endpoints(spec, "http", f"127.0.0.1:{http_port}")
        workload = [LoadRequest(f"prompt {index}", max_tokens=5 + index) for index in range(4)]
        result = run_load_sweep(endpoints, workload, SweepOptions(endpoints=("http",), concurrencies=(2,), requests_per_point=4, warmup=0))
        body = LlmapiModelTarget.body(LoadRequest("hello", max_tokens=3))
        events = _stream(http_port, body)
    finally:
        returncode = triton.stop()
    [point] = result["points"]
    assert point["errors"] == {} and point["completed"] == 4
    assert point["output_tokens"] == sum(5 + index for index in range(4))  # one text chunk per step, every step received
    assert point["ttft_ms"]["p50"] > 0
    # text deltas, one per step, then the final response with the finish reason (NVIDIA's output tensors)
    assert [event["text_output"] for event in events] == [" w0", " w1", " w2", ""]
    assert events[-1]["finish_reason"] == "length"
    assert returncode == 0


ADAPTER = REPO / "models" / "llama-3.1-8b-lora-example"


def test_each_request_selects_its_adapter_or_none_and_bad_selections_are_refused_by_name(tmp_path):
    """build.lora in model.yaml's lora_config; NVIDIA's lora_id / lora_name / lora_path inputs become the LLM's
    LoRARequest for that request only (the stand-in writes the adapter's name into each word it generates)."""
    triton, port = _serve_with_standin(tmp_path, (f"build.lora.adapter_dirs=[{ADAPTER}]",))
    base = {"text_input": "hello", "sampling_param_max_tokens": 2}
    adapter = {"lora_id": 7, "lora_name": "example", "lora_path": str(ADAPTER)}
    try:
        triton.wait_until_ready(timeout=120)
        with_adapter, without, with_adapter_again = (_stream(port, {**base, **extra}) for extra in (adapter, {}, adapter))
        refusals = {
            "partial": _stream(port, {**base, "lora_name": "example"}),
            "nemo": _stream(port, {**base, **adapter, "lora_ckpt_source": "nemo"}),
            "no such path": _stream(port, {**base, **adapter, "lora_path": str(tmp_path / "absent")}),
        }
    finally:
        returncode = triton.stop()
    assert [event["text_output"] for event in with_adapter] == [" example-w0 example-w1"] == [event["text_output"] for event in with_adapter_again]
    assert [event["text_output"] for event in without] == [" w0 w1"]
    messages = {case: " ".join(event.get("error", "") for event in events) for case, events in refusals.items()}
    assert "lora_id, lora_path missing: an adapter is chosen by lora_id, lora_name and lora_path together" in messages["partial"]
    assert "lora_ckpt_source 'nemo': only hf" in messages["nemo"]
    assert f"lora_path '{tmp_path / 'absent'}' is not a directory on this server" in messages["no such path"]
    assert returncode == 0


def test_lora_inputs_to_a_model_built_without_build_lora_are_refused(tmp_path):
    triton, port = _serve_with_standin(tmp_path, ())
    try:
        triton.wait_until_ready(timeout=120)
        events = _stream(port, {"text_input": "hello", "sampling_param_max_tokens": 2, "lora_id": 1, "lora_name": "a", "lora_path": str(ADAPTER)})
    finally:
        returncode = triton.stop()
    assert "this model serves no LoRA adapter (its model.yaml has no lora_config: build it with build.lora)" in events[0]["error"]
    assert returncode == 0
