"""serve.traffic in the rendered repository: the class table as the preprocessing model's `traffic_classes` parameter on
every target, and the `priority` input on the ensemble and BLS only where the LLM model takes one (the cpu model; NVIDIA's
1.2 tensorrt_llm config declares none), wired straight to it."""

from __future__ import annotations

import json

import pytest
from tritonclient.grpc import model_config_pb2

from pipeline.config.spec.traffic import TrafficSpec
from tests.pipeline.render.test_render import parameters, parse, render, tensors, tiny_spec

TRAFFIC = TrafficSpec.model_validate(
    {"classes": [{"name": "interactive", "priority": 1.0, "ttft_slo_ms": 500}, {"name": "batch", "priority": 0.0, "min_share": 0.2}], "default_class": "batch"}
)


@pytest.mark.parametrize("target", ["cpu", "engine"])
def test_the_class_table_is_a_preprocessing_parameter(tmp_path, target):
    repository = render(tmp_path, target=target, serve=tiny_spec().serve.model_copy(update={"traffic": TRAFFIC}))
    table = json.loads(parameters(parse(repository / "preprocessing" / "config.pbtxt"))["traffic_classes"])
    assert TrafficSpec.model_validate(table) == TRAFFIC  # the spec's table, whole


def test_no_table_no_parameter(tmp_path):
    repository = render(tmp_path)
    assert "traffic_classes" not in parameters(parse(repository / "preprocessing" / "config.pbtxt"))


def test_the_cpu_ensemble_and_bls_take_a_priority_and_pass_it_to_the_llm_model(tmp_path):
    repository = render(tmp_path)  # declared with or without a table: a client may send one
    ensemble = parse(repository / "ensemble" / "config.pbtxt")
    assert tensors(ensemble.input)["priority"] == (model_config_pb2.TYPE_FP32, (1,), (), False, True)
    steps = {step.model_name: step for step in ensemble.ensemble_scheduling.step}
    assert steps["tensorrt_llm"].input_map["priority"] == "priority"
    assert tensors(parse(repository / "tensorrt_llm" / "config.pbtxt").input)["priority"][0] == model_config_pb2.TYPE_FP32
    assert "priority" in tensors(parse(repository / "tensorrt_llm_bls" / "config.pbtxt").input)
    wiring = json.loads((repository / "tensorrt_llm_bls" / "1" / "contract.json").read_text())["wiring"]
    assert wiring["client_to_llm"]["priority"] == "priority"


def test_the_engine_target_declares_no_priority_nvidia_s_tensorrt_llm_has_none(tmp_path):
    repository = render(tmp_path, target="engine")
    for model in ("ensemble", "tensorrt_llm", "tensorrt_llm_bls"):
        assert "priority" not in tensors(parse(repository / model / "config.pbtxt").input), model
