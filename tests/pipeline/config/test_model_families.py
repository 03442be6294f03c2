"""The model-family table against tiny random checkpoints of each family, as a new user would try them.

Each family's checkpoint (tests/support/family_models.py: transformers' own classes, random weights, saved as
safetensors) goes through `validate` on every target and, where its row says the target takes it, through
`run --runner dry-run --until package` on the engine and llmapi targets: the checkpoint config the engine would
be built from carries the family's TensorRT-LLM keys, the Triton repository gets the per-layer window vector,
the LLM() options the per-layer window list. Where a target does not take a family, validate refuses by name
and says where it runs instead. These cells are the family × target table of README.md and docs/targets.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.config.families import FAMILIES, family_of
from pipeline.config.targets import Target
from tests.conftest import BUILD_CONFIGS, REPO
from tests.support.family_models import FAMILY_CONFIGS, make_family_checkpoint

CONFIGS = {"cpu": "tiny-cpu.yaml", "engine": "llama-3.1-8b-fp8.yaml", "llmapi": "llama-3.1-8b-fp8-llmapi.yaml"}
# Within every tiny model's 2048 positions and Gemma 2's 4096-token engine limit.
LENGTHS = ("--set", "build.max_seq_len=2048", "--set", "build.max_input_len=1024")
# (model_type, target) -> taken; the documented table.
EXPECTED = {
    "llama": "engine llmapi cpu",
    "mistral": "engine llmapi cpu",
    "mixtral": "engine llmapi cpu",
    "qwen2": "engine llmapi cpu",
    "qwen2_moe": "engine llmapi cpu",
    "qwen3": "engine llmapi cpu",
    "qwen3_moe": "engine llmapi cpu",
    "gemma": "engine cpu",
    "gemma2": "engine cpu",
    "gemma3_text": "engine llmapi cpu",
    "phi3": "engine llmapi cpu",
    "granite": "engine cpu",
    "starcoder2": "engine llmapi cpu",
    "nemotron": "engine llmapi cpu",
    "deepseek_v3": "llmapi",
    "gpt_oss": "llmapi",
    "llama4_text": "llmapi",
    "olmo2": "",
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {model_type: make_family_checkpoint(model_type, root / model_type) for model_type in FAMILY_CONFIGS}


def _validate(model: Path, target: str, *overrides: str, capsys) -> tuple[int, str]:
    code = main(["validate", str(BUILD_CONFIGS / CONFIGS[target]), "--set", f"model.source={model}", *LENGTHS, *overrides])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_every_family_of_the_table_has_a_checkpoint_here():
    assert set(EXPECTED) == set(FAMILY_CONFIGS)
    assert {family_of(t).name for t in FAMILY_CONFIGS} == {f.name for f in FAMILIES}


@pytest.mark.parametrize("model_type", sorted(EXPECTED))
@pytest.mark.parametrize("target", ["engine", "llmapi", "cpu"])
def test_validate_takes_a_family_where_its_row_says(checkpoints, model_type, target, capsys):
    code, output = _validate(checkpoints[model_type], target, capsys=capsys)
    family = family_of(model_type)
    if target in EXPECTED[model_type].split():
        assert code == 0, output
        assert target in family.targets()
        return
    assert code == 2, output
    assert f"build.target: {family.name} does not run on build.target {target}" in output
    taken = EXPECTED[model_type].split()
    if taken:
        assert f"use build.target {' or '.join(taken)}" in output
    else:
        assert "no TensorRT-LLM 1.2 backend runs it" in output
    assert f"model_type '{model_type}' in {checkpoints[model_type] / 'config.json'}" in output


def test_refusals_name_where_the_family_runs_instead(checkpoints, capsys):
    code, output = _validate(checkpoints["deepseek_v3"], "engine", capsys=capsys)
    assert code == 2
    assert (
        "deepseek_v3 does not run on build.target engine: DeepseekV3ForCausalLM is not in TensorRT-LLM 1.2's MODEL_MAP, "
        "so trtllm-build cannot build it; use build.target llmapi"
    ) in output
    code, output = _validate(checkpoints["gemma2"], "llmapi", capsys=capsys)
    assert code == 2 and "TensorRT-LLM 1.2's PyTorch backend registers no Gemma2ForCausalLM; use build.target engine" in output


@pytest.mark.parametrize(
    ("model_type", "target", "algo", "reason"),
    [
        ("qwen3_moe", "engine", "int4_awq", "fused MoE experts"),
        ("mixtral", "llmapi", "w4a8_awq", "fused MoE experts"),
        ("qwen3_moe", "engine", "int8_wo", "weight-only formats on MoE experts"),
        ("mixtral", "engine", "int8_sq", "no INT8 SmoothQuant for MoE"),
        ("gpt_oss", "llmapi", "int4_awq", "gptossforcausallm not supported"),
        ("gemma3_text", "engine", "w4a8_awq", "alpha_step 1"),
        ("starcoder2", "engine", "int4_awq", "StarCoder2"),
    ],
)
def test_a_format_the_family_cannot_take_on_the_target_is_refused(checkpoints, model_type, target, algo, reason, capsys):
    # The examples' FP8 KV cache and FP8 context attention belong to fp8 weights: off, so only the family rule speaks.
    plain = ("--set", "quantize.kv_cache=none", "--set", "build.plugins.use_fp8_context_fmha=false")
    code, output = _validate(checkpoints[model_type], target, "--set", f"quantize.algo={algo}", *plain, capsys=capsys)
    assert code == 2, output
    family = family_of(model_type).name
    assert f"quantize.algo {algo} is not built for {family} on build.target {target}" in output
    assert reason in output


def test_int8_smoothquant_stays_refused_on_llmapi_for_every_family(checkpoints, capsys):
    plain = ("--set", "quantize.kv_cache=none")
    code, output = _validate(checkpoints["qwen3"], "llmapi", "--set", "quantize.algo=int8_sq", *plain, capsys=capsys)
    assert code == 2 and "quantize.algo int8_sq does not run on build.target llmapi" in output


@pytest.mark.parametrize("target", ["engine", "cpu"])
def test_gemma2_is_limited_to_4096_tokens_where_its_checkpoint_has_no_window(checkpoints, target, capsys):
    code, output = _validate(checkpoints["gemma2"], target, "--set", "build.max_seq_len=8192", "--set", "build.max_input_len=4096", capsys=capsys)
    assert code == 2
    assert f"build.max_seq_len: gemma2 on build.target {target} takes at most 4096 tokens, got 8192 from build.max_seq_len" in output


# Every cell of the documented table: each quantize.algo on each target that takes the family is accepted or refused as
# the family row says (kv cache off and FP8 context attention off so that only the weight format speaks; NVFP4 on a
# Blackwell GPU, the only one that runs it).
FORMAT_BASES = {"cpu": "tiny-cpu-fp8.yaml", "engine": "llama-3.1-8b-fp8.yaml", "llmapi": "llama-3.1-8b-fp8-llmapi.yaml"}


@pytest.mark.parametrize(("model_type", "target"), [(t, target) for t in sorted(EXPECTED) for target in EXPECTED[t].split()])
def test_every_format_cell_of_the_table(checkpoints, model_type, target, capsys):
    from pipeline.quant_formats import WEIGHT_FORMATS

    family = family_of(model_type)
    refused_here = []
    for algo, record in WEIGHT_FORMATS.items():
        if not record.runs_on(target):
            continue
        overrides = ["--set", f"quantize.algo={algo}", "--set", "quantize.kv_cache=none", "--set", f"model.source={checkpoints[model_type]}", *LENGTHS]
        if target == "engine":
            overrides += ["--set", "build.plugins.use_fp8_context_fmha=false", "--set", f"deploy.gpu={'B200' if algo == 'nvfp4' else 'H200'}"]
        code = main(["validate", str(BUILD_CONFIGS / FORMAT_BASES[target]), *overrides])
        output = capsys.readouterr()
        if code != 0:
            assert f"quantize.algo {algo} is not built for {family.name} on build.target {target}" in output.out + output.err, output
            refused_here.append(algo)
    assert refused_here == [a for a in WEIGHT_FORMATS if WEIGHT_FORMATS[a].runs_on(target) and family.format_refusal(Target(target), a)]


@pytest.mark.parametrize("page", ["README.md", "docs/targets.md"])
def test_the_documented_table_is_the_family_table(page):
    from pipeline.config.families import support_markdown

    assert support_markdown() in (REPO / page).read_text(encoding="utf-8"), f"{page}'s family table is stale: run `make schema`"


# -- bad checkpoints -------------------------------------------------------------------------------------------------
def _edit_config(model: Path, tmp_path: Path, **changes) -> Path:
    copy = tmp_path / model.name
    copy.mkdir()
    for item in model.iterdir():
        (copy / item.name).symlink_to(item)
    config = json.loads((model / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (copy / "config.json").unlink()
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_unknown_model_type_and_missing_architectures_are_refused_by_name(checkpoints, tmp_path, capsys):
    model = _edit_config(checkpoints["llama"], tmp_path, model_type="falcon_mamba", architectures=["FalconMambaForCausalLM"])
    code, output = _validate(model, "engine", capsys=capsys)
    assert code == 2 and f"{model / 'config.json'}: model_type 'falcon_mamba' (FalconMambaForCausalLM) is not a family this tool knows" in output
    other = tmp_path / "other"
    other.mkdir()
    model = _edit_config(checkpoints["qwen3"], other, architectures=None)
    code, output = _validate(model, "engine", capsys=capsys)
    assert code == 2 and f"{model / 'config.json'}: architectures is missing" in output


def test_more_experts_per_token_than_experts_is_refused(checkpoints, tmp_path, capsys):
    model = _edit_config(checkpoints["qwen3_moe"], tmp_path, num_experts_per_tok=9)
    code, output = _validate(model, "engine", capsys=capsys)
    assert code == 2 and "num_experts_per_tok 9 is more than the 4 experts (num_local_experts)" in output


def test_a_head_dim_that_disagrees_with_the_weights_is_refused(checkpoints, tmp_path, capsys):
    model = _edit_config(checkpoints["qwen3"], tmp_path, head_dim=32)
    code, output = _validate(model, "engine", capsys=capsys)
    assert code == 2
    assert (
        f"{model / 'config.json'}: head_dim 32 disagrees with the weights: layer 0's self_attn.q_proj.weight has 256 rows, 4 heads × 32 would give 128"
    ) in output


def test_a_phi3_fused_qkv_is_checked_against_head_dim_too(checkpoints, tmp_path, capsys):
    model = _edit_config(checkpoints["phi3"], tmp_path, head_dim=16)
    code, output = _validate(model, "engine", capsys=capsys)
    assert code == 2 and "layer 0's self_attn.qkv_proj.weight has 256 rows" in output


def test_a_sliding_window_beyond_the_models_positions_is_refused(checkpoints, tmp_path, capsys):
    model = _edit_config(checkpoints["gemma3_text"], tmp_path, sliding_window=4096)
    code, output = _validate(model, "engine", capsys=capsys)
    assert code == 2
    assert f"{model / 'config.json'}: sliding_window 4096 is larger than max_position_embeddings 2048" in output


def test_a_checkpoint_missing_an_experts_tensors_is_refused(checkpoints, tmp_path, capsys):
    """Per-expert tensors (as transformers saves Mixtral: block_sparse_moe.experts.N.w1) with expert 3 of layer 1 gone."""
    from safetensors.torch import load_file, save_file

    source = checkpoints["mixtral"]
    model = tmp_path / "mixtral"
    model.mkdir()
    for item in source.iterdir():
        if item.suffix != ".safetensors":
            (model / item.name).symlink_to(item)
    tensors = load_file(source / "model.safetensors")
    dropped = [name for name in tensors if "layers.1." in name and "experts.3." in name]
    assert dropped
    save_file({name: t for name, t in tensors.items() if name not in dropped}, model / "model.safetensors")
    code, output = _validate(model, "engine", capsys=capsys)
    assert code == 2
    assert (f"{model / 'config.json'}: num_local_experts is 4, but the checkpoint lacks layer 1's block_sparse_moe.experts.3.w1.weight") in output


def test_more_experts_in_config_than_in_the_checkpoint_is_refused(checkpoints, tmp_path, capsys):
    model = _edit_config(checkpoints["qwen3_moe"], tmp_path, num_local_experts=8)
    code, output = _validate(model, "engine", capsys=capsys)
    assert code == 2 and "num_local_experts is 8, but the checkpoint lacks layer 0's mlp.experts.4." in output
    assert "(and 3 more experts)" in output


def test_fused_experts_of_the_wrong_count_are_refused(checkpoints, tmp_path, capsys):
    """GPT-OSS and Llama 4 keep each layer's experts in one 3-D tensor."""
    model = _edit_config(checkpoints["gpt_oss"], tmp_path, num_local_experts=8)
    code, output = _validate(model, "llmapi", capsys=capsys)
    assert code == 2 and "num_local_experts is 8, but layer 0's mlp.experts.down_proj holds 4 experts" in output


# -- dry runs ------------------------------------------------------------------------------------------------------------
def _dry_run(model: Path, target: str, store: Path) -> Path:
    """plan (with the GPU capacity table) then run --runner dry-run --until package, as a user would."""
    config = ["--set", f"model.source={model}", *LENGTHS]
    assert main(["--artifacts", str(store), "plan", str(BUILD_CONFIGS / CONFIGS[target]), *config, "--gpu", "H200"]) == 0
    assert main(["--artifacts", str(store), "run", str(BUILD_CONFIGS / CONFIGS[target]), *config, "--runner", "dry-run", "--until", "package"]) == 0
    [directory] = (store / Path(CONFIGS[target]).stem).glob("package-*")
    return directory.parent


@pytest.mark.parametrize("model_type", [t for t, targets in EXPECTED.items() if "engine" in targets.split()])
def test_engine_dry_run_renders_the_familys_checkpoint_config_and_repository(checkpoints, model_type, tmp_path):
    root = _dry_run(checkpoints[model_type], "engine", tmp_path)
    [engine] = root.glob("build-*/engine/config.json")
    pretrained = json.loads(engine.read_text())["pretrained_config"]
    hf = json.loads((checkpoints[model_type] / "config.json").read_text())
    assert pretrained["architecture"] == hf["architectures"][0]
    assert pretrained["head_size"] == (hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"])
    family = family_of(model_type)
    if family.trtllm_class == "QWenForCausalLM":
        assert pretrained["qwen_type"] == model_type
        assert pretrained["attn_bias"] is (not model_type.startswith("qwen3"))
    if family.moe:
        experts = hf.get("num_local_experts") or hf.get("num_experts")
        assert pretrained["moe"]["num_experts"] == experts and pretrained["moe"]["top_k"] == hf["num_experts_per_tok"]
    if family.trtllm_class == "GPTForCausalLM":
        assert pretrained["gpt_variant"] == model_type and pretrained["rmsnorm"] is False
    if model_type == "gemma2":
        assert pretrained["query_pre_attn_scalar"] == 64 and pretrained["inter_layernorms"] is True
    [pbtxt] = root.glob("package-*/model_repository/tensorrt_llm/config.pbtxt")
    text = pbtxt.read_text()
    window = text.split('key: "max_attention_window_size"')[1].split("string_value:")[1].split('"')[1]
    assert window == ("512,512,2048" if model_type == "gemma3_text" else "2048")


@pytest.mark.parametrize("model_type", [t for t, targets in EXPECTED.items() if "llmapi" in targets.split()])
def test_llmapi_dry_run_renders_llm_options(checkpoints, model_type, tmp_path):
    root = _dry_run(checkpoints[model_type], "llmapi", tmp_path)
    [options_file] = root.glob("build-*/engine/llm_api_options.json")
    options = json.loads(options_file.read_text())["options"]
    windows = options["kv_cache_config"].get("max_attention_window")
    expected = {"gemma3_text": [512, 512, 2048], "gpt_oss": [128, 2048]}.get(model_type)
    assert windows == expected


# -- the examples (config.json of the real models, no weights) -----------------------------------------------------------
ENGINE_EXAMPLES = ("qwen3-8b-fp8", "qwen3-30b-a3b-fp8", "mixtral-8x7b-fp8", "gemma-3-1b", "phi-4-fp8")
LLMAPI_EXAMPLES = ("gpt-oss-20b-fp8-llmapi", "deepseek-v3-fp8-llmapi-tp8")


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("examples")
    for name in (*ENGINE_EXAMPLES, *LLMAPI_EXAMPLES):
        assert main(["--artifacts", str(store), "run", str(BUILD_CONFIGS / f"{name}.yaml"), "--runner", "dry-run"]) == 0, name
    return store


def test_engine_examples_render_the_window_vector_only_where_the_model_has_windows(examples):
    from pipeline.render.pbtxt import parse_config

    for name in ENGINE_EXAMPLES:
        [pbtxt] = (examples / name).glob("package-*/model_repository/tensorrt_llm/config.pbtxt")
        config = parse_config(pbtxt.read_text(), str(pbtxt))
        window = config.parameters["max_attention_window_size"].string_value
        if name == "gemma-3-1b":  # 26 layers: five local (512) then one global (max_seq_len 8192), repeated
            assert window.split(",") == (["512"] * 5 + ["8192"]) * 4 + ["512", "512"]
        else:
            engine = json.loads(next((examples / name).glob("build-*/engine/config.json")).read_text())
            assert window == str(engine["build_config"]["max_seq_len"])


def test_llmapi_examples_render_options_nvidias_torchllmargs_accept(examples):
    from pipeline.backends.llmapi.options import flatten
    from tests.pipeline.backends.test_llmapi_target import _fits

    for name in LLMAPI_EXAMPLES:
        [options_file] = (examples / name).glob("build-*/engine/llm_api_options.json")
        options = json.loads(options_file.read_text())["options"]
        assert [p for option, value in flatten(options).items() for p in _fits(option, value)] == [], name
    gpt_oss = json.loads(next((examples / "gpt-oss-20b-fp8-llmapi").glob("build-*/engine/llm_api_options.json")).read_text())
    assert gpt_oss["options"]["kv_cache_config"]["max_attention_window"] == [128, 16384] * 12
    deepseek = json.loads(next((examples / "deepseek-v3-fp8-llmapi-tp8").glob("build-*/engine/llm_api_options.json")).read_text())
    assert deepseek["options"]["tensor_parallel_size"] == 8 and "max_attention_window" not in deepseek["options"]["kv_cache_config"]
