"""build.lora's adapters become the LoRA modules TensorRT-LLM 1.2's model class of the family declares for them.

NVIDIA's per-family maps, restated from its source (not from the project's table): the default
(tensorrt_llm/lora_manager.py `get_default_trtllm_modules_to_hf_modules`, used by LLaMA / Qwen2 / Gemma classes:
attn_q ← q_proj, attn_k ← k_proj, attn_v ← v_proj, attn_dense ← o_proj, mlp_h_to_4h ← gate_proj, mlp_4h_to_h ←
down_proj, mlp_gate ← up_proj) and Phi-3's own (tensorrt_llm/models/phi3/model.py, and the same dict in
tensorrt_llm/_torch/models/modeling_phi3.py: attn_qkv ← qkv_proj, attn_dense ← o_proj, mlp_h_to_4h ← gate_up_proj,
mlp_4h_to_h ← down_proj; no attn_q/k/v, no mlp_gate). Phi-3's mlp_h_to_4h adapts the fused fc, [2·I, H]: its lora_B
has 2·I rows (LoraManager.load_from_hf swaps gate_up_proj's halves into TensorRT-LLM's [up; gate]).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.backends.llmapi.lora import lora_options
from pipeline.config.loader import load_config
from pipeline.config.lora_adapters import spec_target_modules
from pipeline.errors import SpecError
from tests.pipeline.backends.test_trtllm_build import V121, _flags, _paths
from tests.pipeline.config.test_lora_validation import write_spec

np = pytest.importorskip("numpy")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

NVIDIA_DEFAULT = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_dense",
    "gate_proj": "mlp_h_to_4h",
    "down_proj": "mlp_4h_to_h",
    "up_proj": "mlp_gate",
}
NVIDIA_PHI3 = {"qkv_proj": "attn_qkv", "o_proj": "attn_dense", "gate_up_proj": "mlp_h_to_4h", "down_proj": "mlp_4h_to_h"}
HIDDEN, INTER, HEADS, KV_HEADS, LAYERS = 64, 96, 4, 2, 2


def _phi3_model(directory: Path) -> Path:
    """A config-only Phi-3 model directory (the adapter checks read its sizes)."""
    directory.mkdir(parents=True)
    config = {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": HIDDEN, "intermediate_size": INTER,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "num_hidden_layers": LAYERS, "vocab_size": 128,
        "max_position_embeddings": 1024, "hidden_act": "silu", "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
    }  # fmt: skip
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _phi3_adapter(directory: Path, *, gate_up_rows: int = 2 * INTER, rank: int = 4) -> Path:
    head = HIDDEN // HEADS
    shapes = {
        "self_attn.qkv_proj": ((HEADS + 2 * KV_HEADS) * head, HIDDEN),
        "self_attn.o_proj": (HIDDEN, HEADS * head),
        "mlp.gate_up_proj": (gate_up_rows, HIDDEN),
        "mlp.down_proj": (HIDDEN, INTER),
    }
    tensors = {}
    for layer in range(LAYERS):
        for module, (out_features, in_features) in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = np.zeros((rank, in_features), np.float16)
            tensors[f"{prefix}.lora_B.weight"] = np.zeros((out_features, rank), np.float16)
    directory.mkdir(parents=True)
    targets = [name.split(".")[-1] for name in shapes]
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 8, "target_modules": targets}))
    safetensors_numpy.save_file(tensors, str(directory / "adapter_model.safetensors"))
    return directory


def _load(tmp_path: Path, adapter: Path, target: str):
    spec = write_spec(tmp_path, model=_phi3_model(tmp_path / "phi3"))
    return load_config(spec, [f"build.lora.adapter_dirs=[{adapter}]", f"build.target={target}"])


@pytest.mark.parametrize("target", ["cpu", "engine", "llmapi"])
def test_a_phi3_adapter_gets_the_modules_phi3s_class_declares(tmp_path, target):
    adapter = _phi3_adapter(tmp_path / "adapter")
    loaded = _load(tmp_path, adapter, target)
    expected = {NVIDIA_PHI3[name] for name in json.loads((adapter / "adapter_config.json").read_text())["target_modules"]}
    assert set(spec_target_modules(loaded.spec.build.lora)) == expected == {"attn_qkv", "attn_dense", "mlp_h_to_4h", "mlp_4h_to_h"}
    if target == "engine":
        from pipeline.backends.engine.trtllm_build import plan_trtllm_build

        argv = plan_trtllm_build(loaded.spec, loaded.model, *_paths(loaded.spec.name), V121).argv
        assert set(_flags(argv)["--lora_target_modules"]) == expected
    if target == "llmapi":
        assert set(lora_options(loaded.spec)["lora_config"]["lora_target_modules"]) == expected


def test_a_phi3_adapter_whose_fused_mlp_update_has_one_half_is_refused(tmp_path):
    """mlp_h_to_4h of Phi-3 adapts the fused [up; gate] fc: a gate_up_proj lora_B of intermediate_size rows fits no
    Linear of the model."""
    adapter = _phi3_adapter(tmp_path / "adapter", gate_up_rows=INTER)
    with pytest.raises(SpecError) as refused:
        _load(tmp_path, adapter, "engine")
    assert "mlp.gate_up_proj.lora_A.weight" in refused.value.message
    assert f"[out_features {2 * INTER}, in_features {HIDDEN}] (2 × intermediate_size, hidden_size" in refused.value.message


def test_the_default_map_and_all_linear_stay_nvidias_default(tmp_path):
    from pipeline.config.lora_adapters import read_adapter

    directory = tmp_path / "all"
    directory.mkdir()
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "target_modules": "all-linear"}))
    assert set(read_adapter(directory).target_modules) == set(NVIDIA_DEFAULT.values())
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "target_modules": list(NVIDIA_DEFAULT)}))
    assert read_adapter(directory).target_modules == tuple(NVIDIA_DEFAULT.values())
