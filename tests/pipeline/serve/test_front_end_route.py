"""The OpenAI front end's default Triton model (pipeline.serve.front_end_route): the ensemble on every Triton (the
BLS deadlocks Triton's Python backend under many concurrent streams); the deployments name it. That the bundled server reports the cpu
backend's version, and that the front end answers through the default route, is tested against the real server
(tests/integration/test_openai_server.py)."""

from __future__ import annotations

import pytest

from pipeline.backends.registry import backend_for
from pipeline.cli import _parser
from pipeline.config.spec import Target
from pipeline.deploy.server_command import openai_command
from pipeline.load.serving import free_ports
from pipeline.serve.front_end_route import BLS_MODEL, front_end_triton_model, triton_version
from tests.pipeline.deploy.test_deploy import load_spec


def test_the_default_route_is_the_ensemble_whatever_it_is_named():
    assert front_end_triton_model("my-ensemble") == "my-ensemble"
    assert front_end_triton_model("my-ensemble") != BLS_MODEL


@pytest.mark.parametrize(("config", "expected"), [("tiny-cpu", "ensemble"), ("llama-3.1-8b-fp8", "ensemble"), ("llama-3.1-8b-fp8-k8s", "ensemble")])
def test_the_deployed_front_end_calls_the_route_of_its_targets_triton(config, expected):
    spec = load_spec(config)
    command = openai_command(spec)
    assert _parser().parse_args(command[1:]).triton_model == expected
    assert expected == front_end_triton_model(spec.serve.model_name)


def test_only_the_cpu_target_fixes_its_triton_version():
    assert {target: backend_for(target).triton_version for target in Target} == {Target.cpu: "2.51.0", Target.engine: None, Target.llmapi: None}


def test_nothing_listening_has_no_version():
    [port] = free_ports(1)
    assert triton_version(f"127.0.0.1:{port}", timeout_s=2) is None
