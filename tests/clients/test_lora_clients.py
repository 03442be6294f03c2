"""How the clients carry a LoRA adapter (clients/lora.py): reading it, its task id, the weights with the first request
only, the inputs it adds, HTTP's refusal of FP16 weights, and the option parsing of infer and the OpenAI front end.
Served end to end: tests/integration/test_lora_serving.py."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import numpy as np
import pytest

from clients.cli import add_infer_arguments, run_infer
from clients.errors import InvalidRequestError
from clients.http import json_body
from clients.lora import LoraAdapter, SentAdapters, digest_task_id
from clients.lora_tensors import LoraAdapterError, convert_peft_adapter, write_lora_tensors
from clients.types import GenerationRequest
from pipeline.cli_openai import lora_adapters
from pipeline.errors import SpecError

ADAPTER = Path(__file__).resolve().parents[2] / "models" / "tiny-stdlib-llama-turtle-lora"


def test_a_peft_dir_and_its_converted_files_are_the_same_adapter_with_the_same_derived_id(tmp_path):
    write_lora_tensors(convert_peft_adapter(ADAPTER), tmp_path / "converted")
    peft, converted = LoraAdapter.from_dir(ADAPTER), LoraAdapter.from_dir(tmp_path / "converted")
    assert np.array_equal(peft.weights, converted.weights) and np.array_equal(peft.config, converted.config)
    assert peft.task_id == converted.task_id and 0 < peft.task_id < 2**63
    assert digest_task_id(peft.weights * 2, peft.config) != peft.task_id  # another adapter, another id
    assert LoraAdapter.from_dir(ADAPTER, 7).task_id == 7


def test_a_directory_without_an_adapter_or_with_pickled_weights_is_refused_by_name(tmp_path):
    with pytest.raises(InvalidRequestError, match=f"lora_dir {tmp_path} holds neither a PEFT adapter"):
        LoraAdapter.from_dir(tmp_path)
    (tmp_path / "adapter_config.json").write_text((ADAPTER / "adapter_config.json").read_text())
    (tmp_path / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(LoraAdapterError, match="pickled weights are never loaded"):
        LoraAdapter.from_dir(tmp_path)
    with pytest.raises(InvalidRequestError, match="lora_task_id must be an unsigned 64-bit integer"):
        LoraAdapter(-1)


def test_the_weights_go_with_the_first_request_of_a_task_id_only():
    sent, adapter = SentAdapters(), LoraAdapter.from_dir(ADAPTER, 5)
    assert [sent.needs_weights(adapter), sent.needs_weights(adapter)] == [True, False]
    sent.forget(adapter)  # the server lost it: the next request carries the weights again
    assert sent.needs_weights(adapter)


def test_a_request_adds_the_task_id_and_with_its_weights_the_tensors():
    adapter = LoraAdapter.from_dir(ADAPTER, 5)
    request = GenerationRequest("import turtle", 8, lora=adapter)
    first, later = request.inputs(stream=False), request.inputs(stream=False, lora_weights=False)
    assert first["lora_task_id"] == 5 and first["lora_weights"] is adapter.weights and first["lora_config"] is adapter.config
    assert later["lora_task_id"] == 5 and "lora_weights" not in later and "lora_config" not in later
    assert "lora_weights" not in GenerationRequest("x", 8, lora=LoraAdapter(5)).inputs(stream=False)  # an id alone
    with pytest.raises(InvalidRequestError, match=r"lora_weights must be a numpy array of shape \[1, rows, n\]"):
        GenerationRequest("x", 8, lora=LoraAdapter(5, adapter.weights[0], adapter.config))


def test_http_refuses_fp16_weights_by_name_and_sends_others_as_nested_lists():
    adapter = LoraAdapter.from_dir(ADAPTER, 5)
    with pytest.raises(InvalidRequestError, match="lora_weights: Triton's HTTP generate endpoint takes no float16 values"):
        json_body(GenerationRequest("x", 8, lora=adapter).inputs(stream=False))
    small = LoraAdapter(5, np.ones((1, 1, 2), np.float32), np.array([[[1, 0, 1]]], np.int32))
    body = json.loads(json_body(GenerationRequest("x", 8, lora=small).inputs(stream=False)))
    assert (body["lora_task_id"], body["lora_weights"], body["lora_config"]) == (5, [[[1.0, 1.0]]], [[[1, 0, 1]]])


def test_infer_over_openai_refuses_the_lora_options():
    args = add_infer_arguments(argparse.ArgumentParser()).parse_args(["x", "--protocol", "openai", "--lora-task-id", "3"])
    err = io.StringIO()
    assert run_infer(args, out=io.StringIO(), err=err) == 1
    assert "--lora-dir / --lora-task-id are Triton inputs; over --protocol openai an adapter is chosen by --model NAME" in err.getvalue()


def test_the_openai_lora_options_are_name_equals_dir_each_name_once(tmp_path):
    assert list(lora_adapters([f"turtle={ADAPTER}", f"again={ADAPTER}"])) == ["turtle", "again"]
    for options, message in (
        (["turtle"], "expected NAME=DIR"),
        ([f"turtle={ADAPTER}", f"turtle={ADAPTER}"], "the name 'turtle' is given twice"),
        ([f"turtle={tmp_path}"], "holds neither a PEFT adapter"),
    ):
        with pytest.raises(SpecError, match=message):
            lora_adapters(options)
