"""`validate` checks build.lora's adapters against the model: the modules it trains exist, every lora_A / lora_B
matrix has the shape the model's layer gives it (from the safetensors headers, or config.json's sizes for a
config-only model), ranks fit build.lora.max_rank, pickled weights are refused; each bad adapter exits 2 naming
the file, the tensor and its value (without torch / numpy / safetensors: tests/repo/test_light_commands.py)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.config.loader import load_config
from pipeline.errors import SpecError
from tests.conftest import DEFAULT_MODEL, REPO, write_model_config

safetensors_numpy = pytest.importorskip("safetensors.numpy")
np = pytest.importorskip("numpy")

PREFIX = "base_model.model.model.layers"
# [out_features, in_features] of tiny-stdlib-llama's layers (hidden 256, intermediate 768, 4 heads × 64, 2 KV heads)
SHAPES = {
    "self_attn.q_proj": (256, 256),
    "self_attn.k_proj": (128, 256),
    "self_attn.v_proj": (128, 256),
    "self_attn.o_proj": (256, 256),
    "mlp.gate_proj": (768, 256),
    "mlp.up_proj": (768, 256),
    "mlp.down_proj": (256, 768),
}


def lora_tensors(modules=("self_attn.q_proj", "self_attn.v_proj"), rank=8, layers=range(4), shapes=SHAPES) -> dict:
    tensors = {}
    for layer in layers:
        for module in modules:
            out_features, in_features = shapes[module]
            tensors[f"{PREFIX}.{layer}.{module}.lora_A.weight"] = np.zeros((rank, in_features), dtype=np.float16)
            tensors[f"{PREFIX}.{layer}.{module}.lora_B.weight"] = np.zeros((out_features, rank), dtype=np.float16)
    return tensors


def write_adapter(directory: Path, tensors: dict, *, r: int = 8, modules=("q_proj", "v_proj")) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": r, "lora_alpha": 16, "target_modules": list(modules)}))
    safetensors_numpy.save_file(tensors, str(directory / "adapter_model.safetensors"))
    return directory


def write_spec(tmp_path: Path, *, model: Path = DEFAULT_MODEL, max_rank: int = 16) -> Path:
    path = tmp_path / "lora.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        name: lora-check
        model:
          source: {model}
        build:
          target: cpu
          max_input_len: 256
          max_seq_len: 512
          max_num_tokens: 1024
          lora:
            adapter_dirs: [adapter]
            max_rank: {max_rank}
        """)
    )
    return path


def refusal(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_config(path)
    return " ".join(info.value.message.split())


def test_an_adapter_that_fits_the_model_validates_on_the_cpu_target(tmp_path):
    write_adapter(tmp_path / "adapter", lora_tensors())
    loaded = load_config(write_spec(tmp_path))
    assert loaded.spec.build.lora.adapter_dirs == (str(tmp_path / "adapter"),)


@pytest.mark.parametrize(
    "tensors, fragments",
    [
        pytest.param(
            {
                **lora_tensors(layers=[0]),
                f"{PREFIX}.1.self_attn.q_proj.lora_A.weight": np.zeros((8, 512), np.float16),
                f"{PREFIX}.1.self_attn.q_proj.lora_B.weight": np.zeros((256, 8), np.float16),
            },
            [
                f"{PREFIX}.1.self_attn.q_proj.lora_A.weight [8, 512]",
                "[out_features 256, in_features 256]",
                f"model.layers.1.self_attn.q_proj.weight in {DEFAULT_MODEL}",
                "expected [8, 256] and [256, 8]",
            ],
            id="in-features-of-another-model",
        ),
        pytest.param(
            lora_tensors(layers=[0, 7]),
            [
                f"{PREFIX}.7.self_attn.q_proj.lora_A.weight adapts model.layers.7.self_attn.q_proj, which the model",
                "(no tensor model.layers.7.self_attn.q_proj.weight)",
            ],
            id="a-layer-the-model-has-not",
        ),
        pytest.param(
            {k: v for k, v in lora_tensors(layers=[0]).items() if "q_proj.lora_B" not in k},
            [f"{PREFIX}.0.self_attn.q_proj.lora_A.weight has no lora_B partner"],
            id="lora-A-alone",
        ),
        pytest.param(
            {
                **lora_tensors(layers=[0], modules=("self_attn.v_proj",)),
                f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": np.zeros((8, 256), np.float16),
                f"{PREFIX}.0.self_attn.q_proj.lora_B.weight": np.zeros((256, 4), np.float16),
            },
            [f"{PREFIX}.0.self_attn.q_proj.lora_A.weight has rank 8 (shape [8, 256]) but", "lora_B.weight has 4 (shape [256, 4])"],
            id="A-and-B-ranks-differ",
        ),
        pytest.param(
            lora_tensors(rank=4, layers=[0]), ["lora_A.weight has rank 4 (shape [4, 256]), but", "adapter_config.json says r = 8"], id="rank-is-not-r"
        ),
        pytest.param(
            lora_tensors(rank=32, layers=[0]), ["lora_A.weight has rank 32 (shape [32, 256]), above build.lora.max_rank (16)"], id="rank-above-max-rank"
        ),
        pytest.param({"base_model.model.lm_head.weight": np.zeros((4, 4), np.float16)}, ["holds no lora_A / lora_B matrix"], id="no-lora-matrix"),
    ],
)
def test_each_bad_adapter_tensor_is_named_with_its_file_key_and_shape(tmp_path, tensors, fragments):
    write_adapter(tmp_path / "adapter", tensors)
    message = refusal(write_spec(tmp_path))
    assert f"build.lora.adapter_dirs.0: {tmp_path / 'adapter' / 'adapter_model.safetensors'}:" in message
    assert [fragment for fragment in fragments if fragment not in message] == []


def test_a_config_only_model_is_checked_against_its_config_sizes(tmp_path):
    model = write_model_config(tmp_path / "model", hidden_size=512)  # q_proj in_features 512, k_proj out 2 × 128
    write_adapter(tmp_path / "adapter", lora_tensors(layers=[0]))  # trained for hidden_size 256
    message = refusal(write_spec(tmp_path, model=model))
    assert "do not fit model.layers.0.self_attn.q_proj of the model, [out_features 512, in_features 512]" in message
    assert f"(num_attention_heads × head_dim, hidden_size in {model / 'config.json'})" in message
    assert "model.layers.0.self_attn.v_proj of the model, [out_features 256, in_features 512]" in message
    assert "num_key_value_heads × head_dim" in message


def test_a_config_only_model_refuses_layers_beyond_its_own(tmp_path):
    model = write_model_config(tmp_path / "model")
    write_adapter(tmp_path / "adapter", lora_tensors(layers=[0, 5]))
    message = refusal(write_spec(tmp_path, model=model))
    assert f"{PREFIX}.5.self_attn.q_proj.lora_A.weight adapts layer 5, but the model has num_hidden_layers 4" in message


def test_pickled_adapter_weights_are_refused(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"]}))
    (adapter / "adapter_model.bin").write_bytes(b"\x80\x04pickled")
    message = refusal(write_spec(tmp_path))
    assert f"{adapter} holds only adapter_model.bin (pickled weights, which can run code when loaded): refused" in message


def test_validate_exits_2_naming_the_adapter(tmp_path, capsys):
    write_adapter(tmp_path / "adapter", lora_tensors(layers=[0, 7]))
    assert main(["--artifacts", str(tmp_path / "store"), "validate", str(write_spec(tmp_path))]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "build.lora.adapter_dirs.0" in err and "model.layers.7.self_attn.q_proj" in err


@pytest.mark.parametrize("algo", ["int8_sq", "int4_awq", "w4a8_awq", "fp8"])
def test_lora_on_the_cpu_target_is_refused_with_formats_that_fold_an_activation_scale_into_the_norm(algo: str) -> None:
    from pipeline.preflight import target_issues

    adapter = REPO / "models" / "tiny-stdlib-llama-turtle-lora"
    overrides = (f"quantize.algo={algo}", "quantize.kv_cache=none", f"build.lora.adapter_dirs=[{adapter}]")
    spec = load_config(REPO / "build_configs" / "tiny-cpu-fp8.yaml", overrides).spec
    issues = target_issues(spec, None)  # the cpu target's rules read the spec only
    if algo == "fp8":
        assert issues == []
        return
    [(where, message)] = issues
    assert where == ("build", "lora")
    assert f"build.lora cannot be combined with quantize.algo {algo} on build.target cpu" in message
    assert message.endswith("use quantize.algo none, fp8, int8_wo")
