"""Which contract the load client speaks against a running deployment (`bench load --url`, gate.performance.url): the
llmapi target's Triton form is NVIDIA's llmapi model (its tensor names, recorded from NVIDIA's config.pbtxt and
rendered by pipeline.backends.llmapi.forms), over http; every other target the ensemble. Served end to end in
tests/integration/test_llmapi_repository.py (the model code over a stand-in LLM) and test_openai_server.py (an
OpenAI URL serving another name than the build's, as trtllm-serve does)."""

from __future__ import annotations

import asyncio

import pytest

from clients.load import LoadRequest, make_target
from clients.load.llmapi_target import LLMAPI_MODEL, LlmapiModelTarget
from pipeline.backends.llmapi.forms import LLM_MODEL, LLMAPI_INPUTS
from pipeline.config.loader import load_config
from pipeline.errors import SpecError
from pipeline.load.remote import remote_endpoints, served_model
from tests.pipeline.backends.test_llmapi_target import EXAMPLE, RECORDED

_PYTHON_TYPES = {"TYPE_STRING": str, "TYPE_BOOL": bool, "TYPE_INT32": int, "TYPE_FP32": float}


def test_the_llmapi_request_uses_nvidias_tensor_names_and_types():
    body = LlmapiModelTarget.body(LoadRequest("hi", max_tokens=7))
    declared = {name: dtype for name, dtype, _, _ in LLMAPI_INPUTS}
    assert set(body) <= set(declared) <= set(RECORDED["config_pbtxt"]["inputs"])
    assert all(type(value) is _PYTHON_TYPES[declared[name]] for name, value in body.items())
    assert body["sampling_param_max_tokens"] == 7 and body["streaming"] is True and LLMAPI_MODEL == LLM_MODEL


def test_make_target_picks_the_contract_and_refuses_grpc_for_llmapi():
    target = make_target("http", "127.0.0.1:8000", contract="llmapi")
    assert isinstance(target, LlmapiModelTarget) and target.url == "http://127.0.0.1:8000" and target.model == "tensorrt_llm"
    asyncio.run(target.close())
    with pytest.raises(ValueError, match="llmapi model is measured over http"):
        make_target("grpc", "127.0.0.1:8001", contract="llmapi")
    with pytest.raises(ValueError, match="contract must be one of ensemble, llmapi"):
        make_target("http", "127.0.0.1:8000", contract="openai")


def test_remote_endpoints_follow_the_target():
    llmapi = load_config(EXAMPLE).spec
    assert remote_endpoints(llmapi, "http", "127.0.0.1:8000").triton_contract == "llmapi"
    engine = load_config(EXAMPLE.parent / "llama-3.1-8b-fp8.yaml").spec
    assert remote_endpoints(engine, "grpc", "127.0.0.1:8001").triton_contract == "ensemble"
    with pytest.raises(SpecError, match="build.target llmapi serves NVIDIA's llmapi model, measured over http"):
        remote_endpoints(llmapi, "grpc", "127.0.0.1:8001")


def test_an_unreachable_openai_url_is_refused_naming_it():
    with pytest.raises(SpecError, match=r"cannot list the models served at http://127.0.0.1:9/v1/models"):
        served_model("http://127.0.0.1:9", "tiny-cpu")
