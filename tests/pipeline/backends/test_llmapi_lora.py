"""LoRA on the llmapi target: build.lora rendered into LLM()'s lora_config and serve.lora into peft_cache_config, every
field checked against TorchLlmArgs / LoraConfig / PeftCacheConfig as recorded from TensorRT-LLM 1.2
(tests/data/llmapi_1_2_1_llm_args.json, `fields` and `lora`), the adapters linked into the served model directory and
named there by both forms, a golden of the trtllm-serve options with an adapter. Regenerate the golden:
`UPDATE_GOLDEN=1 pytest tests/pipeline/backends/test_llmapi_lora.py`."""

from __future__ import annotations

import dataclasses
import json
import os
from types import MappingProxyType

import pytest
import yaml

from pipeline.backends.base import BuildJob
from pipeline.backends.llmapi.forms import LLMAPI_INPUTS, serve_options_yaml
from pipeline.backends.llmapi.lora import served_lora_options
from pipeline.backends.llmapi.options import build_options, flatten, merged_options, option_issues, serve_options
from pipeline.backends.llmapi.versions import SUPPORTED_VERSIONS
from pipeline.backends.registry import backend_for
from pipeline.config.loader import load_config
from pipeline.config.spec import Target
from pipeline.errors import StageError
from tests.conftest import REPO
from tests.pipeline.backends.test_llmapi_target import EXAMPLE, GOLDEN, RECORDED, _fits

ADAPTER = REPO / "models" / "llama-3.1-8b-lora-example"  # rank 16, q/k/v/o (config only)
LORA = [f"build.lora.adapter_dirs=[{ADAPTER}]", "build.lora.max_rank=32"]
SERVE_LORA = ["serve.lora.cache_optimal_adapter_size=16", "serve.lora.cache_gpu_memory_fraction=0.1", "serve.lora.cache_host_memory_bytes=2147483648"]


def _served(overrides, model_path="/engine"):
    loaded = load_config(EXAMPLE, overrides)
    build = build_options(loaded.spec, loaded.model)
    return {**merged_options(build, serve_options(loaded.spec.serve)), **served_lora_options(build, loaded.spec.serve, model_path)}


def test_every_lora_option_is_a_field_of_nvidias_lora_and_peft_cache_configs():
    options = _served([*LORA, *SERVE_LORA])
    flat = {option: value for option, value in flatten(options).items() if option.startswith(("lora_config.", "peft_cache_config."))}
    assert [p for option, value in flat.items() for p in _fits(option, value)] == []
    assert flat == {
        "lora_config.lora_dir": ["/engine/lora/0"],  # build.lora.adapter_dirs[0], linked into the served model directory
        "lora_config.lora_ckpt_source": "hf",
        "lora_config.max_lora_rank": 32,
        "lora_config.lora_target_modules": ["attn_q", "attn_k", "attn_v", "attn_dense"],  # read from the adapter's config
        "peft_cache_config.optimal_adapter_size": 16,
        "peft_cache_config.max_adapter_size": 32,  # serve.lora.cache_max_adapter_size defaults to build.lora.max_rank
        "peft_cache_config.device_cache_percent": 0.1,
        "peft_cache_config.host_cache_size": 2147483648,
    }
    for option, kind in SUPPORTED_VERSIONS["1.2.1"].options.items():  # the profile's LoRA options are NVIDIA's, typed alike
        if option.startswith(("lora_config.", "peft_cache_config.")):
            assert kind.kind == RECORDED["fields"][option]["type"], option


def test_without_serve_lora_the_cache_gets_the_engine_targets_defaults():
    cache = _served(LORA)["peft_cache_config"]
    # lora_cache_* defaults of NVIDIA's Triton model, largest adapter = build.lora.max_rank (as on the engine target)
    assert cache == {"optimal_adapter_size": 8, "max_adapter_size": 32, "device_cache_percent": 0.05, "host_cache_size": 1 << 30}


def test_without_build_lora_no_lora_option_is_rendered():
    options = _served([])
    assert "lora_config" not in options and "peft_cache_config" not in options


def test_target_modules_of_the_spec_win_over_the_adapters():
    options = _served([*LORA, "build.lora.target_modules=[attn_q, attn_k, attn_v, attn_dense, mlp_h_to_4h]"])
    assert options["lora_config"]["lora_target_modules"] == ["attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h"]


def test_both_forms_carry_the_same_lora_options_and_the_triton_model_takes_nvidias_lora_inputs(tmp_path):
    loaded, job = _lora_job(tmp_path, runner="dry-run")
    llmapi = backend_for(Target.llmapi)
    assert llmapi.build(job)["adapter_files"] == 0  # a dry run links nothing
    files = {
        **llmapi.llm_api.triton_files(job.engine_dir, loaded.spec.serve, "/engine"),
        **llmapi.llm_api.openai_files(job.engine_dir, loaded.spec.serve, "/engine"),
    }
    triton = yaml.safe_load(files["tensorrt_llm/1/model.yaml"])
    served = yaml.safe_load(files["extra-llm-api-config.yml"])
    for key in ("lora_config", "peft_cache_config"):
        assert triton[key] == served[key]
    assert triton["lora_config"]["lora_dir"] == ["/engine/lora/0"]
    recorded = RECORDED["config_pbtxt"]["inputs"]
    lora_inputs = {name: [dtype, optional] for name, dtype, _, optional in LLMAPI_INPUTS if name.startswith("lora_")}
    assert lora_inputs == {name: recorded[name] for name in ("lora_id", "lora_name", "lora_path", "lora_ckpt_source")}


def _lora_job(tmp_path, runner="local", weights=True):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text((ADAPTER / "adapter_config.json").read_text())
    loaded = load_config(EXAMPLE, [f"build.lora.adapter_dirs=[{adapter}]", f"build.runner={runner}"])
    if weights:  # written after validation: the build links the file, it does not read it
        (adapter / "adapter_model.safetensors").write_bytes(b"adapter weights")
    quantize = tmp_path / "quantize"
    (quantize / "hf_checkpoint").mkdir(parents=True)
    (quantize / "hf_checkpoint" / "config.json").write_text("{}")
    engine = tmp_path / "build" / "engine"
    return loaded, BuildJob(loaded.spec, loaded.model, quantize / "trtllm_checkpoint", engine, engine, log=lambda line: None)


def test_the_build_links_each_adapter_into_the_served_model_directory(tmp_path):
    _, job = _lora_job(tmp_path)
    notes = backend_for(Target.llmapi).build(job)
    assert (notes["checkpoint_files"], notes["adapter_files"]) == (1, 2)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert os.stat(job.engine_dir / "lora" / "0" / name).st_ino == os.stat(tmp_path / "adapter" / name).st_ino
    record = json.loads((job.engine_dir / "llm_api_options.json").read_text())
    assert record["options"]["lora_config"]["lora_dir"] == ["lora/0"]  # made absolute under the model path by the package stage


def test_a_build_refuses_an_adapter_without_its_weights(tmp_path):
    _, job = _lora_job(tmp_path, weights=False)
    with pytest.raises(StageError, match=r"build.lora.adapter_dirs\[0\]: .*adapter_model.safetensors is missing"):
        backend_for(Target.llmapi).build(job)


def test_a_lora_option_the_version_lacks_is_refused_naming_the_spec_field(monkeypatch):
    profile = SUPPORTED_VERSIONS["1.2.1"]
    older = dataclasses.replace(profile, options=MappingProxyType({k: v for k, v in profile.options.items() if k != "lora_config.max_lora_rank"}))
    monkeypatch.setattr("pipeline.backends.llmapi.options.get_llmapi_version", lambda version: older)
    loaded = load_config(EXAMPLE, LORA)
    assert option_issues(loaded.spec, loaded.model) == [
        (
            ("build", "lora", "max_rank"),
            "build.lora.max_rank sets LLM() option lora_config.max_lora_rank, which TensorRT-LLM 1.2.1 does not have (build.target llmapi)",
        )
    ]


def test_the_lora_options_match_the_golden():
    text = serve_options_yaml(_served([*LORA, *SERVE_LORA]))
    if os.environ.get("UPDATE_GOLDEN"):
        (GOLDEN / "extra-llm-api-config-lora.yml").write_text(text)
    assert text == (GOLDEN / "extra-llm-api-config-lora.yml").read_text()


def test_the_docs_say_how_each_form_selects_an_adapter():
    page = " ".join((REPO / "docs" / "targets.md").read_text().split())
    section = page[page.index("### LoRA on the llmapi target") :]
    for fragment in ('"lora_request"', '"lora_int_id"', "lora_id", "lora_name", "lora_path", "/engine/lora/0", "peft_cache_config"):
        assert fragment in section, fragment
