"""Speculative decoding on the llmapi target: every rendered speculative_config against NVIDIA's decoding configs as
recorded from 1.2's llm_args.py (tests/data/llmapi_1_2_1_llm_args.json, `speculative_configs`), draft-target's draft
checkpoint linked into the build's engine directory and named as speculative_model_dir in both forms, a golden of the
trtllm-serve options with a draft. Regenerate the golden: `UPDATE_GOLDEN=1 pytest tests/pipeline/backends/test_llmapi_speculative.py`."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from pipeline.backends.base import BuildJob
from pipeline.backends.llmapi.forms import serve_options_yaml
from pipeline.backends.llmapi.options import build_options, merged_options, serve_options, with_draft_model_dir
from pipeline.backends.registry import backend_for
from pipeline.config.loader import load_config
from pipeline.config.spec import Target
from tests.pipeline.backends.test_llmapi_target import EXAMPLE, GOLDEN, RECORDED

DRAFT = ["build.speculative.mode=draft_tokens_external", "build.speculative.max_draft_len=4", "build.speculative.draft.source=../models/llama-3.2-1b-instruct"]
PROMPT_LOOKUP = ["build.speculative.mode=prompt_lookup", "build.speculative.max_draft_len=3"]
CONFIGS = RECORDED["speculative_configs"]


def _problems(config: dict) -> list[str]:
    recorded = CONFIGS["classes"].get(config["decoding_type"])
    if recorded is None:
        return [f"decoding_type {config['decoding_type']!r} is not a discriminator of 1.2's SpeculativeConfig"]
    names = {CONFIGS["base_aliases"].get(key, key) for key in config if key != "decoding_type"}
    problems = [f"{name}: not a field of {recorded['class']}" for name in names - set(CONFIGS["base_fields"]) - set(recorded["fields"])]
    problems += [f"{name}: {recorded['class']} requires it" for name in set(recorded["required"]) - names]
    return problems + ([] if "pytorch" in recorded["backends"] else [f"{recorded['class']} does not run on pytorch"])


@pytest.mark.parametrize("overrides", [DRAFT, PROMPT_LOOKUP], ids=["draft_tokens_external", "prompt_lookup"])
def test_every_speculative_config_is_one_nvidia_decodes_on_pytorch(overrides):
    loaded = load_config(EXAMPLE, overrides)
    options = with_draft_model_dir(build_options(loaded.spec, loaded.model), "/engine")
    assert _problems(options["speculative_config"]) == []


def test_a_misspelt_or_engine_only_config_is_caught_by_the_check():
    assert _problems({"decoding_type": "DraftTarget", "max_draft_len": 4})[0].startswith("decoding_type 'DraftTarget'")
    assert _problems({"decoding_type": "Draft_Target", "max_draft_len": 4}) == ["speculative_model: DraftTargetDecodingConfig requires it"]


def _draft_job(tmp_path, runner="local"):
    loaded = load_config(EXAMPLE, [*DRAFT, f"build.runner={runner}"])
    quantize = tmp_path / "quantize"
    (quantize / "hf_checkpoint").mkdir(parents=True)
    (quantize / "hf_checkpoint" / "config.json").write_text("{}")
    (quantize / "hf_checkpoint" / "model.safetensors").write_bytes(b"target")
    draft = tmp_path / "draft" / "engine"
    draft.mkdir(parents=True)
    (draft / "config.json").write_text("{}")
    (draft / "model.safetensors").write_bytes(b"draft")
    engine = tmp_path / "build" / "engine"
    job = BuildJob(loaded.spec, loaded.model, quantize / "trtllm_checkpoint", engine, engine, log=lambda line: None, draft_engine_dir=draft)
    return loaded, job


def test_the_build_links_the_drafts_checkpoint_and_both_forms_name_it(tmp_path):
    loaded, job = _draft_job(tmp_path)
    llmapi = backend_for(Target.llmapi)
    assert llmapi.build(job)["checkpoint_files"] == 4
    draft = job.engine_dir / "draft" / "model.safetensors"
    assert os.stat(draft).st_ino == os.stat(job.draft_engine_dir / "model.safetensors").st_ino
    assert json.loads((job.engine_dir / "llm_api_options.json").read_text())["options"]["speculative_config"] == {
        "decoding_type": "Draft_Target",
        "max_draft_len": 4,
    }
    files = {
        **llmapi.llm_api.triton_files(job.engine_dir, loaded.spec.serve, "/engine"),
        **llmapi.llm_api.openai_files(job.engine_dir, loaded.spec.serve, "/engine"),
    }
    triton = yaml.safe_load(files["tensorrt_llm/1/model.yaml"])
    served = yaml.safe_load(files["extra-llm-api-config.yml"])
    expected = {"decoding_type": "Draft_Target", "max_draft_len": 4, "speculative_model_dir": "/engine/draft"}
    assert triton["speculative_config"] == served["speculative_config"] == expected


def test_a_draft_without_its_checkpoint_is_refused_by_the_build(tmp_path):
    from pipeline.errors import StageError

    _, job = _draft_job(tmp_path)
    (job.draft_engine_dir / "config.json").unlink()
    with pytest.raises(StageError, match="holds no Hugging Face checkpoint .config.json. of the draft for speculative_model_dir"):
        backend_for(Target.llmapi).build(job)


def test_the_draft_target_options_match_the_golden():
    loaded = load_config(EXAMPLE, DRAFT)
    options = with_draft_model_dir(merged_options(build_options(loaded.spec, loaded.model), serve_options(loaded.spec.serve)), "/engine")
    text = serve_options_yaml(options)
    if os.environ.get("UPDATE_GOLDEN"):
        (GOLDEN / "extra-llm-api-config-draft-target.yml").write_text(text)
    assert text == (GOLDEN / "extra-llm-api-config-draft-target.yml").read_text()


# -- EAGLE-3 (the user's draft checkpoint) and MTP (the model's own layers): the PyTorch backend's head-based drafting --
DEEPSEEK = EXAMPLE.parent / "deepseek-v3-fp8-llmapi-tp8.yaml"


def _eagle_heads(tmp_path):
    heads = tmp_path / "eagle3"
    heads.mkdir(parents=True)
    (heads / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32000}))
    (heads / "model.safetensors").write_bytes(b"eagle")
    return heads


def _eagle(tmp_path):
    return ["build.speculative.mode=eagle", "build.speculative.max_draft_len=3", f"build.speculative.eagle.heads={_eagle_heads(tmp_path)}"]


def test_eagle3_and_mtp_configs_are_ones_nvidia_decodes_on_pytorch(tmp_path):
    eagle = load_config(EXAMPLE, _eagle(tmp_path))
    options = with_draft_model_dir(build_options(eagle.spec, eagle.model), "/engine")
    assert options["speculative_config"] == {"decoding_type": "Eagle3", "max_draft_len": 3, "eagle3_one_model": True, "speculative_model_dir": "/engine/draft"}
    assert _problems(options["speculative_config"]) == []
    mtp = load_config(DEEPSEEK, ["build.speculative.mode=mtp"])
    config = build_options(mtp.spec, mtp.model)["speculative_config"]
    assert config == {"decoding_type": "MTP", "num_nextn_predict_layers": 1} and _problems(config) == []


def test_the_build_links_the_eagle3_checkpoint(tmp_path):
    loaded = load_config(EXAMPLE, [*_eagle(tmp_path), "build.runner=local"])
    quantize = tmp_path / "quantize"
    (quantize / "hf_checkpoint").mkdir(parents=True)
    (quantize / "hf_checkpoint" / "config.json").write_text("{}")
    engine = tmp_path / "build" / "engine"
    job = BuildJob(loaded.spec, loaded.model, quantize / "trtllm_checkpoint", engine, engine, log=lambda line: None)
    assert backend_for(Target.llmapi).build(job)["checkpoint_files"] == 3
    assert (engine / "draft" / "model.safetensors").read_bytes() == b"eagle"


def test_head_based_modes_are_refused_where_nvidia_has_no_path(tmp_path):
    from pipeline.errors import SpecError

    def refused(path, overrides):
        with pytest.raises(SpecError) as info:
            load_config(path, overrides)
        return info.value.message

    # MTP needs the model's own MTP layers: a Llama has none
    assert "num_nextn_predict_layers is 0, below build.speculative.mtp.num_nextn_predict_layers (1)" in refused(EXAMPLE, ["build.speculative.mode=mtp"])
    assert "below build.speculative.mtp.num_nextn_predict_layers (2)" in refused(
        DEEPSEEK, ["build.speculative.mode=mtp", "build.speculative.mtp.num_nextn_predict_layers=2"]
    )
    assert "is not an EAGLE-3 draft checkpoint directory: cannot read" in refused(
        EXAMPLE, ["build.speculative.mode=eagle", "build.speculative.max_draft_len=3", f"build.speculative.eagle.heads={tmp_path}"]
    )
    heads = _eagle_heads(tmp_path / "other")
    (heads / "config.json").write_text(json.dumps({"hidden_size": 2048}))
    assert "hidden_size (2048) differs from the model's (4096)" in refused(
        EXAMPLE, ["build.speculative.mode=eagle", "build.speculative.max_draft_len=3", f"build.speculative.eagle.heads={heads}"]
    )
    # the engine target builds EAGLE-1/2 (tests/pipeline/backends/test_eagle.py): an EAGLE-3 checkpoint is refused there by name
    engine = ["build.target=engine", "deploy.gpu=H200", "build.runner=dry-run", "quantize.device=cuda"]
    assert "is below the 63 nodes of build.speculative.eagle.choices (NVIDIA's default tree mc_sim_7b_63)" in refused(
        EXAMPLE, [*_eagle(tmp_path / "3"), *engine]
    )
    assert "is an EAGLE-3 checkpoint (draft_vocab_size or an Eagle3 architecture in its config.json): build.target engine builds EAGLE-1/2" in refused(
        EXAMPLE,
        ["build.speculative.mode=eagle", "build.speculative.max_draft_len=63", f"build.speculative.eagle.heads={_eagle_heads(tmp_path / '63')}", *engine],
    )
