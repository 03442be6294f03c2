"""EAGLE-1/2 on the engine target: the spec's eagle section (one section, EAGLE-3 on llmapi and EAGLE-1/2 on engine),
validate's refusals by name, the trtllm-build command (NVIDIA's 1.2.1 parser), the EAGLE checkpoint writer, the Triton
parameters and the plan line.

The EAGLE checkpoint is a random one written in tmp_path in SafeAILab EAGLE's layout (tests/support/eagle_draft.py). No
EAGLE engine can be built or served here (no GPU): the checkpoint is checked against TensorRT-LLM 1.2's names and shapes
(tensorrt_llm/models/eagle/model.py, examples/eagle/convert_checkpoint.py), the command against its parser.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.backends.base import BuildJob
from pipeline.backends.engine.trtllm_build import plan_trtllm_build
from pipeline.config.eagle_tree import MC_SIM_7B_63, non_leaves_per_layer
from pipeline.config.loader import load_config
from pipeline.errors import SpecError
from pipeline.trtllm_versions import get_version, validate_argv
from refengine.speculative.medusa_tree import format_medusa_choices
from tests.conftest import REPO, write_model_config
from tests.pipeline.backends.test_trtllm_build import SCHEMA
from tests.support.eagle_draft import write_eagle_draft
from tests.support.tree_engine import render_for_engine
from tests.support.validate_probe import validate_probe

V121 = get_version("1.2.1")
SMALL_TREE = [[0], [1], [0, 0], [1, 0], [0, 1], [0, 0, 0]]


def _config(tmp_path: Path, heads: Path) -> Path:
    path = tmp_path / "engine-eagle.yaml"
    path.write_text(f"""name: tiny-engine-eagle
model:
  source: {REPO / "models" / "tiny-stdlib-llama"}
  dtype: float16
build:
  target: engine
  runner: dry-run
  max_batch_size: 32
  max_input_len: 768
  max_seq_len: 1024
  max_num_tokens: 2048
  speculative:
    mode: eagle
    eagle:
      heads: {heads}
deploy:
  gpu: H200
  gpus: [0]
""")
    return path


@pytest.fixture
def heads(tmp_path) -> Path:
    return write_eagle_draft(tmp_path / "eagle")


def _load(heads: Path, *overrides: str):
    return load_config(_config(heads.parent, heads), list(overrides))


def _refused(heads: Path, *overrides: str) -> str:
    with pytest.raises(SpecError) as info:
        _load(heads, *overrides)
    return info.value.message


# -- the spec ------------------------------------------------------------------------------------------------------
def test_the_engine_tree_defaults_to_nvidias_and_sizes_the_engine(heads):
    speculative = _load(heads).spec.build.speculative
    assert speculative.eagle.tree == MC_SIM_7B_63 and speculative.draft_len == 63
    assert non_leaves_per_layer(MC_SIM_7B_63) == 10  # examples/eagle/README.md: "exactly 10 non leaf nodes at depth 0"
    chosen = _load(heads, f"build.speculative.eagle.choices={SMALL_TREE}").spec.build.speculative
    assert chosen.draft_len == 6
    assert _load(heads, f"build.speculative.eagle.choices={SMALL_TREE}", "build.speculative.max_draft_len=10").spec.build.speculative.draft_len == 10


REFUSED = {
    "malformed tree": (("build.speculative.eagle.choices=[[0], [1, 1]]",), "build.speculative.eagle.choices path [1, 1] has no parent"),
    "too many nodes": ((f"build.speculative.eagle.choices={[[i] for i in range(257)]}",), "build.speculative.eagle.choices has 257 nodes, more than 256"),
    "max_draft_len below the tree": (
        ("build.speculative.max_draft_len=8",),
        "max_draft_len (8) is below the 63 nodes of build.speculative.eagle.choices (NVIDIA's default",
    ),
    "beams": (("build.max_beam_width=2",), "build.max_beam_width (2) must be 1 with build.speculative (mode eagle)"),
    "EAGLE-3's one_model": (("build.speculative.eagle.one_model=false",), "build.speculative.eagle.one_model applies to EAGLE-3 (target llmapi)"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_bad_eagle_settings_are_refused_at_validate(case, heads):
    overrides, message = REFUSED[case]
    assert message in _refused(heads, *overrides)


@pytest.mark.parametrize(
    "what, kwargs, message",
    [
        ("hidden size", {"hidden": 128}, "hidden_size (128) differs from the model's (256"),
        ("vocabulary", {"vocab_size": 32000}, "vocab_size (32000) differs from the model's (4096"),
        ("a missing tensor", {"drop": ("fc.bias",)}, "has no tensor fc.bias (SafeAILab EAGLE's layout"),
        ("a missing layer", {"num_hidden_layers": 2}, "has no tensor layers.1.self_attn.q_proj.weight"),
        ("a wrong shape", {"vocab": 1000, "vocab_size": 4096}, "embed_tokens.weight has shape [1000, 256], expected [4096, 256]"),
        ("an EAGLE-3 checkpoint", {"draft_vocab_size": 32000}, "is an EAGLE-3 checkpoint (draft_vocab_size or an Eagle3 architecture"),
        ("another activation", {"hidden_act": "gelu"}, "hidden_act 'gelu': TensorRT-LLM's EAGLE example builds the draft layer with silu"),
    ],
)
def test_eagle_checkpoints_that_disagree_with_the_model_are_refused(tmp_path, what, kwargs, message):
    heads = write_eagle_draft(tmp_path / "eagle", **kwargs)
    assert message in _refused(heads)


def test_pickles_and_missing_directories_are_refused(tmp_path):
    heads = write_eagle_draft(tmp_path / "eagle")
    (heads / "model.safetensors").rename(heads / "pytorch_model.bin")
    assert "has no *.safetensors (pytorch_model.bin are pickles, which can run code when loaded)" in _refused(heads)
    assert "EAGLE draft checkpoint directory not found" in _refused(tmp_path / "nowhere")


def test_one_eagle_section_serves_both_targets(heads):
    """choices are the engine's (EAGLE-1/2 trees); llmapi's EAGLE-3 drafts a chain and needs max_draft_len."""
    llmapi = REPO / "build_configs" / "llama-3.1-8b-fp8-llmapi.yaml"
    with pytest.raises(SpecError, match="build.speculative.eagle.choices is refused on build.target llmapi"):
        load_config(
            llmapi,
            [
                "build.speculative.mode=eagle",
                "build.speculative.max_draft_len=3",
                f"build.speculative.eagle.heads={heads}",
                f"build.speculative.eagle.choices={SMALL_TREE}",
            ],
        )
    with pytest.raises(SpecError, match="build.speculative.max_draft_len is required for mode eagle on build.target llmapi"):
        load_config(llmapi, ["build.speculative.mode=eagle", f"build.speculative.eagle.heads={heads}"])


def _validate(tmp_path: Path, heads: Path, *overrides: str) -> tuple[str, str]:
    return validate_probe(tmp_path / "store", _config(tmp_path, heads), *overrides)


def test_validate_stays_light_and_refuses_with_exit_2(tmp_path, heads):
    status, output = _validate(tmp_path, heads)
    assert status == "0 []", output
    status, output = _validate(tmp_path, write_eagle_draft(tmp_path / "small", hidden=128))
    assert status.startswith("2 "), output
    assert "build.speculative.eagle.heads" in output and "hidden_size (128) differs" in output
    # what trtllm-build's EAGLE does not build is a spec fact: validate refuses it too
    status, output = _validate(tmp_path, heads, "quantize.algo=fp8", f"quantize.calibration.files=[{REPO}/data/calibration/*.txt]")
    assert status.startswith("2 "), output
    assert "build.speculative.mode" in output and "cannot be combined with quantize.algo fp8" in output


# -- trtllm-build ----------------------------------------------------------------------------------------------------
def _plan(heads: Path, *overrides: str):
    loaded = _load(heads, *overrides)
    return plan_trtllm_build(loaded.spec, loaded.model, Path("/a/build/eagle_checkpoint"), Path("/a/build/engine"), V121, 90)


def _engine_refusal(heads: Path, *overrides: str) -> str:
    with pytest.raises(SpecError) as info:
        _plan(heads, *overrides)
    return info.value.message


def test_the_engine_command_passes_nvidias_parser_with_eagles_side_effects(heads):
    build = _plan(heads)
    validate_argv(build.argv, SCHEMA)
    argv = " ".join(build.argv)
    assert "--speculative_decoding_mode eagle" in argv and "--max_draft_len 63" in argv
    assert build.build_config["speculative_decoding_mode"] == 32
    assert build.settings.use_paged_context_fmha  # builder.py turns it on for EAGLE
    # trtllm-build adds max_draft_len and num_eagle_layers (the tree's depth, 4) to max_seq_len (tensorrt_llm/builder.py)
    assert build.engine_build_config["max_seq_len"] == 1024 + 63 + 4
    assert build.build_config["max_num_tokens"] >= 32 * (63 + 1)


def test_the_engine_refuses_what_tensorrt_llms_eagle_does_not_build(heads, tmp_path):
    calibration = f"quantize.calibration.files=[{REPO}/data/calibration/*.txt]"
    assert "eagle cannot be combined with quantize.algo fp8" in _engine_refusal(heads, "quantize.algo=fp8", calibration)
    assert "quantize.kv_cache fp8" in _engine_refusal(heads, "quantize.kv_cache=fp8", calibration)
    assert "eagle cannot be built with build.pp_size 2: TensorRT-LLM's EAGLE does not support pipeline parallelism" in _engine_refusal(
        heads, "build.pp_size=2", "deploy.gpus=[0, 1]"
    )
    assert "build.max_batch_size (1024) exceeds 512" in _engine_refusal(heads, "build.max_batch_size=1024", "build.max_num_tokens=65536")
    model = write_model_config(
        tmp_path / "model",
        architectures=["MixtralForCausalLM"],
        model_type="mixtral",
        num_local_experts=2,
        num_experts_per_tok=1,
        hidden_size=256,
        vocab_size=4096,
    )
    assert "eagle needs a Llama-family model" in _engine_refusal(heads, f"model.source={model}")


# -- the EAGLE checkpoint ------------------------------------------------------------------------------------------
def _base_checkpoint(directory: Path, tp: int) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    directory.mkdir(parents=True)
    config = {
        "architecture": "LlamaForCausalLM",
        "dtype": "bfloat16",
        "logits_dtype": "float32",
        "vocab_size": 4096,
        "hidden_size": 256,
        "max_position_embeddings": 1024,
        "rotary_base": 10000.0,
        "mapping": {"world_size": tp, "tp_size": tp, "pp_size": 1},
        "quantization": {"quant_algo": None},
    }
    (directory / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(1)
    for rank in range(tp):
        save_file({"lm_head.weight": rng.standard_normal((4096 // tp, 256)).astype(np.float16)}, str(directory / f"rank{rank}.safetensors"))
    return directory


def test_the_eagle_checkpoint_holds_the_draft_layer_under_tensorrt_llm_names(tmp_path):
    import torch
    from safetensors.torch import load_file

    from pipeline.backends.engine.eagle_checkpoint import write_eagle_checkpoint

    heads = write_eagle_draft(tmp_path / "eagle", layers=2)
    base = _base_checkpoint(tmp_path / "base", tp=2)
    written = write_eagle_checkpoint(base, heads, tmp_path / "out", choices=SMALL_TREE, max_draft_len=8)
    assert written["architecture"] == "EagleForCausalLM"
    assert (written["num_eagle_layers"], written["max_non_leaves_per_layer"], written["max_draft_len"]) == (3, 10, 8)
    net = written["eagle_net_config"]
    assert net["architecture"] == "LlamaForCausalLM" and net["num_hidden_layers"] == 2 and net["vocab_size"] == 4096
    assert (net["num_attention_heads"], net["num_key_value_heads"], net["intermediate_size"], net["head_size"]) == (4, 2, 512, 64)
    assert net["quantization"] == {"quant_algo": None, "kv_cache_quant_algo": None} and net["mapping"]["tp_size"] == 2
    source = load_file(str(heads / "model.safetensors"))
    for rank in range(2):
        tensors = load_file(str(tmp_path / "out" / f"rank{rank}.safetensors"))
        rows = slice(rank * 128, (rank + 1) * 128)
        for net_index in range(3):  # one EagleNet per level of the tree, each the same trained layer
            drafter = f"eagle_nets.{net_index}.drafter"
            assert torch.equal(tensors[f"{drafter}.fc.weight"], source["fc.weight"][rows].to(torch.bfloat16))
            assert tensors[f"{drafter}.fc.bias"].shape == (128,)
            assert torch.equal(tensors[f"{drafter}.vocab_embedding.weight"], source["embed_tokens.weight"].to(torch.bfloat16))
            q, k, v = (source[f"layers.1.self_attn.{n}_proj.weight"] for n in "qkv")
            kv_rows = slice(rank * 64, (rank + 1) * 64)
            expected_qkv = torch.cat([q[rows], k[kv_rows], v[kv_rows]]).to(torch.bfloat16)
            assert torch.equal(tensors[f"{drafter}.layers.1.attention.qkv.weight"], expected_qkv)
            assert tensors[f"{drafter}.layers.0.attention.dense.weight"].shape == (256, 128)
            assert tensors[f"{drafter}.layers.0.mlp.fc.weight"].shape == (256, 256)  # gate_proj, rows split
            assert tensors[f"{drafter}.layers.0.mlp.proj.weight"].shape == (256, 256)  # down_proj, columns split
            assert f"{drafter}.layers.0.input_layernorm.weight" not in tensors  # EagleNet's first layer has none
            assert f"{drafter}.layers.1.input_layernorm.weight" in tensors and f"{drafter}.ln_f.weight" not in tensors
            assert torch.equal(tensors[f"eagle_nets.{net_index}.lm_head.weight"], tensors["lm_head.weight"])
        assert not any(key.startswith(("fc.", "layers.", "embed_tokens")) for key in tensors)


def test_a_dry_run_names_the_command_that_writes_the_eagle_checkpoint_and_it_does(heads, tmp_path):
    from pipeline.backends.engine.eagle_checkpoint import main
    from pipeline.backends.engine.target import heads_checkpoint

    loaded = _load(heads, f"build.speculative.eagle.choices={SMALL_TREE}")
    checkpoint = tmp_path / "quantize" / "trtllm_checkpoint"  # the quantize job is a dry run too: nothing there yet
    logged: list[str] = []
    final = tmp_path / "final" / "engine"
    job = BuildJob(loaded.spec, loaded.model, checkpoint, tmp_path / "work" / "engine", final, log=logged.append)
    assert heads_checkpoint(job) == tmp_path / "final" / "eagle_checkpoint"
    [line] = logged
    assert f"python3 -m pipeline.backends.engine.eagle_checkpoint {checkpoint} {heads} {tmp_path / 'final' / 'eagle_checkpoint'} --choices" in line
    assert "--max-draft-len 6" in line
    _base_checkpoint(checkpoint, tp=1)
    assert main([str(checkpoint), str(heads), str(tmp_path / "out"), "--choices", json.dumps(SMALL_TREE), "--max-draft-len", "6"]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["num_eagle_layers"] == 3


def test_the_engine_build_merges_the_eagle_layer_before_trtllm_build(heads, tmp_path):
    from pipeline.backends.engine.target import BACKEND as ENGINE_BACKEND
    from pipeline.backends.engine_facts import engine_facts

    loaded = _load(heads)
    checkpoint = _base_checkpoint(tmp_path / "quantize" / "trtllm_checkpoint", tp=1)
    engine = tmp_path / "build" / "engine"
    notes = ENGINE_BACKEND.build(BuildJob(loaded.spec, loaded.model, checkpoint, engine, engine, log=lambda m: None))
    written = json.loads((tmp_path / "build" / "eagle_checkpoint" / "config.json").read_text())
    assert written["architecture"] == "EagleForCausalLM" and written["num_eagle_layers"] == 4
    command = " ".join(notes["command"])
    assert f"--checkpoint_dir {tmp_path / 'build' / 'eagle_checkpoint'}" in command and "--speculative_decoding_mode eagle" in command
    facts = engine_facts(json.loads((engine / "config.json").read_text()))
    assert (facts.speculative_decoding_mode, facts.num_eagle_layers, facts.max_draft_len) == ("eagle", 4, 63)
    assert facts.usable_seq_len == 1024  # the recorded max_seq_len holds the draft and the EagleNets' tokens
    # a dry run before the quantize job ran: the engine config comes from the Hugging Face config, with the same depth
    early = tmp_path / "early" / "engine"
    ENGINE_BACKEND.build(BuildJob(loaded.spec, loaded.model, tmp_path / "none", early, early, log=lambda m: None))
    facts = engine_facts(json.loads((early / "config.json").read_text()))
    assert (facts.num_eagle_layers, facts.usable_seq_len) == (4, 1024)


# -- Triton and plan -------------------------------------------------------------------------------------------------
def test_the_repository_renders_eagle_choices_and_refuses_a_tree_larger_than_the_engine(heads, tmp_path):
    from pipeline.errors import StageError
    from pipeline.render.pbtxt import parse_config

    tree = f"build.speculative.eagle.choices={SMALL_TREE}"
    loaded, build = _load(heads, tree), _plan(heads, tree)
    llm = render_for_engine(build, loaded, tmp_path / "fits", architecture="EagleForCausalLM", max_draft_len=6)
    assert llm.parameters["decoding_mode"].string_value == "eagle"
    assert llm.parameters["eagle_choices"].string_value == format_medusa_choices(SMALL_TREE) == "{0}, {1}, {0, 0}, {1, 0}, {0, 1}, {0, 0, 0}"
    assert "medusa_choices" not in llm.parameters
    with pytest.raises(StageError, match="build.speculative.eagle.choices has 6 nodes but the engine has build_config.max_draft_len 3"):
        render_for_engine(build, loaded, tmp_path / "small", architecture="EagleForCausalLM", max_draft_len=3)
    # the engine's num_eagle_layers is the depth every tree must have
    llm = render_for_engine(build, loaded, tmp_path / "deep", architecture="EagleForCausalLM", max_draft_len=6, num_eagle_layers=3)
    preprocessing = parse_config((tmp_path / "deep" / "repository" / "preprocessing" / "config.pbtxt").read_text(), "preprocessing")
    assert preprocessing.parameters["max_seq_len"].string_value == "1024"  # trtllm-build's + 6 + 3 taken off again
    with pytest.raises(StageError, match="build.speculative.eagle.choices is 3 deep but the engine has pretrained_config.num_eagle_layers 4"):
        render_for_engine(build, loaded, tmp_path / "other", architecture="EagleForCausalLM", max_draft_len=6, num_eagle_layers=4)


def test_plan_names_the_generation_the_tree_and_what_the_engine_needs(heads):
    from pipeline.speculative.summary import speculative_summary

    line = speculative_summary(_load(heads, f"build.speculative.eagle.choices={SMALL_TREE}").spec.build)
    assert "eagle, drafts from an EAGLE-1/2 draft layer (eagle): a tree of 6 nodes, 3 deep (num_eagle_layers 3); max_draft_len 6" in line
    assert "max_seq_len + 9 tokens per sequence" in line
    assert 'Triton decoding_mode eagle, eagle_choices "{0}, {1}, {0, 0}, {1, 0}, {0, 1}, {0, 0, 0}"' in line
    default = speculative_summary(_load(heads).spec.build)
    assert "a tree of 63 nodes, 4 deep, NVIDIA's default mc_sim_7b_63" in default
