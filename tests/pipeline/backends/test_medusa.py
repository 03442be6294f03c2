"""Medusa in the spec, at validate, in the cpu build (the refengine contract), the Triton parameters of both targets,
the engine target's trtllm-build command (NVIDIA's 1.2.1 parser) and its Medusa checkpoint.

The heads are random ones written in tmp_path in the contract's layout (tests/support/medusa_heads.py): the trained heads
of models/tiny-stdlib-llama-medusa are another helper's and not needed here. A Medusa cpu engine cannot be run on
this branch (refengine's Medusa reading side is another helper's): the build's output is checked against the contract.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.backends.base import BuildJob
from pipeline.backends.cpu.target import BACKEND as CPU
from pipeline.backends.engine.trtllm_build import plan_trtllm_build
from pipeline.config.loader import load_config
from pipeline.errors import SpecError
from pipeline.plan import plan
from pipeline.trtllm_versions import get_version, validate_argv
from refengine.speculative.medusa_tree import format_medusa_choices, tree_problem
from tests.conftest import BUILD_CONFIGS, write_model_config
from tests.pipeline.backends.test_draft_target import tiny_checkpoint  # noqa: F401 (a fixture)
from tests.pipeline.backends.test_trtllm_build import SCHEMA
from tests.support.medusa_heads import DEFAULT_CHOICES, write_medusa_heads
from tests.support.tree_engine import render_for_engine
from tests.support.validate_probe import validate_probe

CPU_MEDUSA = BUILD_CONFIGS / "tiny-cpu-medusa.yaml"
# tiny-cpu-medusa.yaml names its own tree and vocabulary cut for the shipped 4 heads; these tests point it at random
# heads and exercise the defaults read from them
HEADS_DEFAULTS = ("build.speculative.medusa.choices=null", "build.speculative.medusa.vocab_size=null")
V121 = get_version("1.2.1")


@pytest.fixture
def heads(tmp_path) -> Path:
    return write_medusa_heads(tmp_path / "heads")


def _load(heads: Path, *overrides: str, path: Path = CPU_MEDUSA):
    return load_config(path, [f"build.speculative.medusa.heads={heads}", *HEADS_DEFAULTS, *overrides])


def _refused(heads: Path, *overrides: str, path: Path = CPU_MEDUSA) -> str:
    with pytest.raises(SpecError) as info:
        _load(heads, *overrides, path=path)
    return info.value.message


# -- the tree ------------------------------------------------------------------------------------------------
def test_a_tree_is_checked_and_written_in_nvidias_string_form():
    assert tree_problem(DEFAULT_CHOICES) is None
    assert format_medusa_choices([[0], [0, 0], [1], [0, 1]]) == "{0}, {0, 0}, {1}, {0, 1}"
    assert tree_problem([[0, 1], [0]]) is None  # a parent after its child is fine
    assert "has no parent" in tree_problem([[0], [1, 0]])
    assert "listed twice" in tree_problem([[0], [0]])
    assert "ints >= 0" in tree_problem([[0], [-1]])
    assert "non-empty list" in tree_problem([])


# -- validate: each bad input refused by name ------------------------------------------------------------------
def test_the_default_tree_comes_from_the_heads(heads):
    speculative = _load(heads).spec.build.speculative
    assert speculative.medusa.tree == DEFAULT_CHOICES and speculative.draft_len == len(DEFAULT_CHOICES)
    bounded = _load(heads, "build.speculative.max_draft_len=10").spec.build.speculative
    assert bounded.draft_len == 10


REFUSED = {
    "malformed": (("build.speculative.medusa.choices=[[0], [0, -1]]",), "build.speculative.medusa.choices path 1 ([0, -1]) must hold ints >= 0"),
    "not a list of lists": (("build.speculative.medusa.choices=[0, 1]",), "build.speculative.medusa.choices.0: Input should be a valid list"),
    "empty": (("build.speculative.medusa.choices=[]",), "build.speculative.medusa.choices must be a non-empty list"),
    "duplicate": (("build.speculative.medusa.choices=[[0], [0]]",), "build.speculative.medusa.choices path [0] is listed twice"),
    "missing prefix": (("build.speculative.medusa.choices=[[0], [1, 1]]",), "path [1, 1] has no parent: its prefix [1]"),
    "deeper than the heads": (
        ("build.speculative.medusa.choices=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]",),
        "path [0, 0, 0, 0] is 4 deep: it reads head 3, which does not exist (the heads in",
    ),
    "more nodes than max_draft_len": (("build.speculative.max_draft_len=3",), "build.speculative.max_draft_len (3) is below the 7 nodes"),
    "beams": (("build.max_beam_width=2",), "build.max_beam_width (2) must be 1 with build.speculative (mode medusa)"),
    "medusa section elsewhere": (
        ("build.speculative.mode=prompt_lookup", "build.speculative.max_draft_len=4"),
        "build.speculative.medusa applies to mode medusa only, not prompt_lookup",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_bad_medusa_inputs_are_refused_at_validate(case, heads):
    overrides, message = REFUSED[case]
    assert message in _refused(heads, *overrides)


@pytest.mark.parametrize(
    "what, change, message",
    [
        ("hidden size", {"hidden": 128}, "has shape [128, 128], expected [256, 256] (the model's hidden_size 256"),
        ("vocabulary", {"vocab": 1000}, "has shape [1000, 256], expected [4096, 256]"),
        ("config's vocabulary", {"vocab_size": 32000}, "vocab_size (32000) differs from the model's (4096"),
        ("more heads in the config than the file", {"medusa_num_heads": 4}, "has no tensor 3.0.linear.weight (medusa_num_heads 4"),
        ("fewer heads in the config than the file", {"medusa_num_heads": 2}, "holds tensors the heads' config.json does not describe (2.0.linear.bias"),
    ],
)
def test_heads_that_disagree_with_the_model_or_their_config_are_refused(tmp_path, what, change, message):
    sizes = {key: change.pop(key) for key in ("hidden", "vocab") if key in change}
    heads = write_medusa_heads(tmp_path / "heads", **sizes)
    config = json.loads((heads / "config.json").read_text())
    (heads / "config.json").write_text(json.dumps({**config, **change}))
    assert message in _refused(heads)


def test_a_missing_heads_file_or_tree_is_refused(tmp_path):
    heads = write_medusa_heads(tmp_path / "heads")
    (heads / "medusa_lm_head.safetensors").rename(heads / "medusa_lm_head.pt")
    assert "has no medusa_lm_head.safetensors (medusa_lm_head.pt are pickles" in _refused(heads)
    untreed = write_medusa_heads(tmp_path / "untreed", choices=None)
    assert "build.speculative.medusa.choices is required: the heads'" in _refused(untreed)
    assert "build.speculative.medusa.choices is not set and the heads'" in _refused(tmp_path / "nowhere")


def _validate(tmp_path: Path, *overrides: str) -> tuple[str, str]:
    return validate_probe(tmp_path / "store", CPU_MEDUSA, *HEADS_DEFAULTS, *overrides)


def test_validate_through_the_cli_stays_light_and_refuses_with_exit_2(tmp_path, heads):
    status, output = _validate(tmp_path, f"build.speculative.medusa.heads={heads}")
    assert status == "0 []", output
    status, output = _validate(tmp_path, f"build.speculative.medusa.heads={heads}", "build.speculative.medusa.choices=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]")
    assert status.startswith("2 "), output
    assert "build.speculative.medusa.choices" in output and "head 3, which does not exist" in output


def test_the_targets_say_what_they_build(heads):
    llmapi = _refused(heads, "build.target=llmapi")
    assert "build.speculative.mode medusa is refused on build.target llmapi" in llmapi and "supports_backend" in llmapi
    assert "mode eagle is refused on build.target cpu" in _refused(
        heads, "build.speculative.mode=eagle", "build.speculative.medusa=null", "build.speculative.max_draft_len=3", f"build.speculative.eagle.heads={heads}"
    )


def test_the_plan_hashes_the_heads_and_the_tree(heads, tmp_path):
    from pipeline.runner import gather_facts

    loaded = _load(heads)
    base = plan(loaded.spec, gather_facts(loaded))
    other_tree = plan(_load(heads, "build.speculative.medusa.choices=[[0], [1]]").spec, gather_facts(loaded))
    assert other_tree.stage("build").digest != base.stage("build").digest
    assert other_tree.stage("quantize").digest == base.stage("quantize").digest
    # the heads by content, not by path
    retrained = _load(write_medusa_heads(tmp_path / "retrained", seed=1))
    assert plan(retrained.spec, gather_facts(retrained)).stage("build").digest != base.stage("build").digest
    copied = _load(shutil.copytree(heads, tmp_path / "copied"))
    assert plan(copied.spec, gather_facts(copied)).stage("build").digest == base.stage("build").digest


# -- cpu target: the refengine contract and the Triton parameters ------------------------------------------------
def test_the_cpu_build_writes_the_contracts_engine_directory(tiny_checkpoint, heads, tmp_path):  # noqa: F811
    loaded = _load(heads)
    engine = tmp_path / "engine"
    CPU.build(BuildJob(loaded.spec, loaded.model, tiny_checkpoint, engine, engine, log=lambda m: None))
    config = json.loads((engine / "config.json").read_text())
    assert config["build_config"]["speculative_decoding_mode"] == 4 and config["build_config"]["max_draft_len"] == 7
    assert config["build_config"]["max_seq_len"] == 1024 + 7
    assert config["refengine_speculative"] == {
        "kind": "medusa",
        "max_draft_len": 7,
        "medusa_heads": "medusa/medusa_lm_head.safetensors",
        "num_medusa_heads": 3,
        "num_medusa_layers": 1,
        "medusa_choices": DEFAULT_CHOICES,
    }
    assert (engine / "medusa" / "medusa_lm_head.safetensors").read_bytes() == (heads / "medusa_lm_head.safetensors").read_bytes()
    assert json.loads((engine / "medusa" / "config.json").read_text())["medusa_num_heads"] == 3
    # the rendered repository: the cpu tensorrt_llm model carries decoding_mode and the tree, the ensemble and the BLS
    # are the usual ones
    from pipeline.render import RepositoryRequest, render_model_repository
    from pipeline.render.pbtxt import parse_config

    out = tmp_path / "repository"
    render_model_repository(
        RepositoryRequest(
            engine_dir=engine,
            tokenizer_dir=tmp_path / "no-tokenizer",
            serve=loaded.spec.serve,
            target="cpu",
            out_dir=out,
            speculative=loaded.spec.build.speculative,
            dry_run=True,
        )
    )
    llm = parse_config((out / "tensorrt_llm" / "config.pbtxt").read_text(), "tensorrt_llm")
    assert llm.parameters["decoding_mode"].string_value == "medusa"
    assert llm.parameters["medusa_choices"].string_value == "{0}, {1}, {0, 0}, {2}, {0, 1}, {1, 0}, {0, 0, 0}"
    # the BLS drafts for draft-target engines only: max_draft_len 0 refuses num_draft_tokens on a Medusa engine by name
    bls = parse_config((out / "tensorrt_llm_bls" / "config.pbtxt").read_text(), "tensorrt_llm_bls")
    assert bls.parameters["max_draft_len"].string_value == "0"
    assert {path.parent.name for path in out.glob("*/config.pbtxt")} == {"ensemble", "preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls"}


# -- engine target -----------------------------------------------------------------------------------------------
ENGINE = ("build.target=engine", "deploy.gpu=H200", "deploy.gpus=[0]", "build.runner=dry-run")


def _engine_plan(heads: Path, *overrides: str):
    loaded = _load(heads, *ENGINE, *overrides)
    return plan_trtllm_build(loaded.spec, loaded.model, Path("/a/build/medusa_checkpoint"), Path("/a/build/engine"), V121, 90)


def test_the_engine_command_passes_nvidias_parser_with_medusas_side_effects(heads):
    build = _engine_plan(heads)
    validate_argv(build.argv, SCHEMA)
    argv = " ".join(build.argv)
    assert "--speculative_decoding_mode medusa" in argv and "--max_draft_len 7" in argv
    assert build.build_config["speculative_decoding_mode"] == 4
    assert build.engine_build_config["max_seq_len"] == 1024 + 7  # trtllm-build adds max_draft_len (tensorrt_llm/builder.py)
    assert build.build_config["max_num_tokens"] >= 32 * (7 + 1)


def _engine_refusal(heads: Path, *overrides: str) -> str:
    with pytest.raises(SpecError) as info:
        _engine_plan(heads, *overrides)
    return info.value.message


def test_the_engine_refuses_what_tensorrt_llm_does_not_combine_with_medusa(heads, tmp_path):
    assert "cannot be combined with quantize.algo int8_wo on build.target engine" in _engine_refusal(heads, "quantize.algo=int8_wo")
    validate_argv(_engine_plan(heads, "quantize.algo=fp8", "quantize.calibration.files=[../data/calibration/*.txt]").argv, SCHEMA)
    # a Llama-family base only: a config-only Mixtral is refused by name
    model = write_model_config(tmp_path / "model", architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=2, num_experts_per_tok=1)
    assert "medusa needs a Llama- or Qwen2-family model" in _engine_refusal(heads, f"model.source={model}")


def test_the_medusa_checkpoint_holds_the_heads_under_tensorrt_llm_names(heads, tmp_path):
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from pipeline.backends.engine.medusa_checkpoint import write_medusa_checkpoint

    base = tmp_path / "base"
    base.mkdir()
    config = {
        "architecture": "LlamaForCausalLM",
        "dtype": "bfloat16",
        "vocab_size": 4096,
        "hidden_size": 256,
        "mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1},
        "quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head"]},
    }
    (base / "config.json").write_text(json.dumps(config))
    for rank in range(2):
        save_file({"lm_head.weight": np.zeros((2048, 256), np.float16)}, str(base / f"rank{rank}.safetensors"))
    written = write_medusa_checkpoint(base, heads, tmp_path / "out", max_draft_len=7)
    assert written["architecture"] == "MedusaForCausalLM" and written["model_type"] == "llama"
    assert (written["num_medusa_heads"], written["num_medusa_layers"], written["max_draft_len"]) == (3, 1, 7)
    assert written["quantization"]["exclude_modules"] == ["lm_head", "*medusa_heads*"]  # heads stay unquantized
    source = load_file(str(heads / "medusa_lm_head.safetensors"))
    import torch
    from safetensors.torch import load_file as load_torch

    for rank in range(2):
        tensors = load_torch(str(tmp_path / "out" / f"rank{rank}.safetensors"))
        weight = tensors["medusa_heads.2.medusa_layers.0.linear.weight"]
        assert weight.shape == (128, 256) and weight.dtype == torch.bfloat16
        expected = torch.from_numpy(source["2.0.linear.weight"][rank * 128 : (rank + 1) * 128]).to(torch.bfloat16)
        assert torch.equal(weight, expected)
        assert tensors["medusa_heads.0.medusa_layers.0.linear.bias"].shape == (128,)
        assert tensors["medusa_heads.1.lm_head.weight"].shape == (2048, 256)
        assert "lm_head.weight" in tensors and not any(key.startswith(("0.", "1.", "2.")) for key in tensors)


def test_the_engine_build_merges_the_heads_before_trtllm_build(heads, tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    from pipeline.backends.engine.target import BACKEND as ENGINE_BACKEND

    loaded = _load(heads, *ENGINE)
    checkpoint = tmp_path / "quantize" / "trtllm_checkpoint"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text(
        json.dumps(
            {
                "architecture": "LlamaForCausalLM",
                "dtype": "float16",
                "vocab_size": 4096,
                "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
                "quantization": {},
            }
        )
    )
    save_file({"lm_head.weight": np.zeros((4096, 256), np.float16)}, str(checkpoint / "rank0.safetensors"))
    engine = tmp_path / "build" / "engine"
    notes = ENGINE_BACKEND.build(BuildJob(loaded.spec, loaded.model, checkpoint, engine, engine, log=lambda m: None))
    assert json.loads((tmp_path / "build" / "medusa_checkpoint" / "config.json").read_text())["architecture"] == "MedusaForCausalLM"
    command = " ".join(notes["command"])
    assert f"--checkpoint_dir {tmp_path / 'build' / 'medusa_checkpoint'}" in command and "--speculative_decoding_mode medusa" in command


def test_plan_says_the_mode_the_tree_and_what_the_engine_needs(heads):
    from pipeline.speculative.summary import speculative_summary

    line = speculative_summary(_load(heads).spec.build)
    assert "medusa, drafts from Medusa heads: a tree of 7 nodes, 3 deep (reads heads 0..2); max_draft_len 7" in line
    assert "max_seq_len + 7 tokens per sequence and max_num_tokens >= max_batch_size × 8 = 256" in line
    assert 'medusa_choices "{0}, {1}, {0, 0}, {2}, {0, 1}, {1, 0}, {0, 0, 0}"' in line


def test_a_dry_run_without_a_checkpoint_names_the_command_that_writes_it(heads, tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    from pipeline.backends.engine.medusa_checkpoint import main
    from pipeline.backends.engine.target import heads_checkpoint

    loaded = _load(heads, *ENGINE)
    checkpoint = tmp_path / "quantize" / "trtllm_checkpoint"  # the quantize job is a dry run too: nothing there yet
    logged: list[str] = []
    final = tmp_path / "final" / "engine"
    job = BuildJob(loaded.spec, loaded.model, checkpoint, tmp_path / "work" / "engine", final, log=logged.append)
    assert heads_checkpoint(job) == tmp_path / "final" / "medusa_checkpoint"
    [line] = logged
    assert f"python3 -m pipeline.backends.engine.medusa_checkpoint {checkpoint} {heads} {tmp_path / 'final' / 'medusa_checkpoint'} --max-draft-len 7" in line
    # and that command writes it, once the quantize job has run
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text(
        json.dumps({"architecture": "LlamaForCausalLM", "dtype": "float16", "vocab_size": 4096, "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}})
    )
    save_file({"lm_head.weight": np.zeros((4096, 256), np.float16)}, str(checkpoint / "rank0.safetensors"))
    assert main([str(checkpoint), str(heads), str(tmp_path / "out"), "--max-draft-len", "7"]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["num_medusa_heads"] == 3


def test_the_engine_repository_renders_the_tree_and_refuses_one_larger_than_the_engine(heads, tmp_path):
    from pipeline.errors import StageError

    loaded, build = _load(heads, *ENGINE), _engine_plan(heads)
    llm = render_for_engine(build, loaded, tmp_path / "fits", architecture="MedusaForCausalLM", max_draft_len=7)
    assert llm.parameters["decoding_mode"].string_value == "medusa"
    assert llm.parameters["medusa_choices"].string_value == format_medusa_choices(DEFAULT_CHOICES)
    with pytest.raises(StageError, match="build.speculative.medusa.choices has 7 nodes but the engine has build_config.max_draft_len 3"):
        render_for_engine(build, loaded, tmp_path / "small", architecture="MedusaForCausalLM", max_draft_len=3)
