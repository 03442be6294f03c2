"""`clients.lora_tensors` and `trtllm-pipeline lora convert`: a PEFT adapter as NVIDIA's lora_weights / lora_config.

The expected layout is written out here from TensorRT-LLM's source, independently of the converter:
`examples/hf_lora_convert.py` (rows [module_id, layer, rank] int32 with LoraManager.LORA_MODULE_IDS; a row's weights are
lora_A flattened, then lora_B × lora_alpha / r flattened, zero-padded to the longest row; gate_up_proj's lora_B halves
swapped; a leading batch axis of 1; float16 by default; files model.lora_weights.npy / model.lora_config.npy) and
`runtime/loraCache.cpp` `copyToPages` (how the engine reads a row back: `weightsIn` [rank, in] from its start,
`weightsOut` [out, rank] right after). Reading the converted rows back that way must give PEFT's own update.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from clients.lora_tensors import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    LoraAdapterError,
    convert_peft_adapter,
    read_lora_tensors,
    write_lora_tensors,
)
from pipeline.cli import main

# TensorRT-LLM's LoraManager.LORA_MODULE_IDS and hf_lora_convert.py's hf_modules_to_trtllm_modules, as published
NVIDIA_IDS = {"attn_qkv": 0, "attn_q": 1, "attn_k": 2, "attn_v": 3, "attn_dense": 4, "mlp_h_to_4h": 5, "mlp_4h_to_h": 6, "mlp_gate": 7}
NVIDIA_MODULES = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_dense",
    "qkv_proj": "attn_qkv",
    "gate_proj": "mlp_h_to_4h",
    "up_proj": "mlp_gate",
    "down_proj": "mlp_4h_to_h",
    "gate_up_proj": "mlp_h_to_4h",
}
TINY = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def _peft_model(model_type: str, targets: list[str], rank: int = 4, alpha: float = 16, **lora: object):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **TINY))
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, **lora))
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                parameter.copy_(0.1 * torch.randn_like(parameter))
    return peft_model.eval()


@pytest.fixture(scope="module")
def llama_adapter(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama_adapter")
    model = _peft_model("llama", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model.save_pretrained(directory)
    return directory, model


def _expected(directory, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """NVIDIA's layout, built from the saved tensors as hf_lora_convert.py describes it (rows by layer, then module id)."""
    tensors = load_file(str(directory / "adapter_model.safetensors"))
    rows = []
    for key, a in tensors.items():
        if ".lora_A." not in key:
            continue
        b = tensors[key.replace(".lora_A.", ".lora_B.")]
        layer, module = int(key.split(".layers.")[1].split(".")[0]), key.split(".lora_A.")[0].rsplit(".", 1)[1]
        if module == "gate_up_proj":
            b = torch.cat((b[b.shape[0] // 2 :], b[: b.shape[0] // 2]))
        rows.append((layer, NVIDIA_IDS[NVIDIA_MODULES[module]], a.shape[0], torch.cat((a.flatten(), (b * scale).flatten()))))
    rows.sort(key=lambda row: row[:2])
    width = max(len(row[3]) for row in rows)
    weights = torch.stack([torch.nn.functional.pad(row[3], (0, width - len(row[3]))) for row in rows]).half()
    return weights.unsqueeze(0).numpy(), np.array([[[module, layer, rank] for layer, module, rank, _ in rows]], dtype=np.int32)


def test_layout_is_nvidias_shapes_order_and_dtype(llama_adapter) -> None:
    directory, _ = llama_adapter
    tensors = convert_peft_adapter(directory)
    weights, config = _expected(directory, scale=16 / 4)
    assert tensors.config.dtype == np.int32 and tensors.weights.dtype == np.float16
    assert tensors.config.shape == (1, 2 * 7, 3) and tensors.weights.shape == (1, 14, 4 * (64 + 32))  # down/gate/up rows longest
    np.testing.assert_array_equal(tensors.config, config)
    np.testing.assert_array_equal(tensors.weights, weights)
    assert tensors.config[0, :7].tolist() == [[i, 0, 4] for i in range(1, 8)]  # layer 0: attn_q .. mlp_gate, then layer 1


def test_rows_read_back_as_the_engine_does_give_peft_updates(llama_adapter) -> None:
    """Each row sliced as copyToPages does (A [r, in], then B [out, r]) gives x Aᵀ Bᵀ = PEFT's lora_B(lora_A(x)) × scaling."""
    directory, peft_model = llama_adapter
    tensors = convert_peft_adapter(directory, dtype="float32")
    names = {v: k for k, v in NVIDIA_IDS.items()}
    hf_names = {v: k for k, v in NVIDIA_MODULES.items() if k not in ("qkv_proj", "gate_up_proj")}
    x = torch.randn(3, 64)
    for (module_id, layer, rank), row in zip(tensors.config[0], tensors.weights[0]):
        hf_module = hf_names[names[module_id]]
        parent = "mlp" if hf_module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
        linear = getattr(getattr(peft_model.base_model.model.model.layers[layer], parent), hf_module)
        a_in, b_out = linear.lora_A["default"].in_features, linear.lora_B["default"].out_features
        a = torch.from_numpy(row[: rank * a_in].reshape(rank, a_in))
        b = torch.from_numpy(row[rank * a_in : rank * (a_in + b_out)].reshape(b_out, rank))
        assert not row[rank * (a_in + b_out) :].any()  # the rest is padding
        inputs = x[:, :a_in]
        with torch.no_grad():
            expected = linear.lora_B["default"](linear.lora_A["default"](inputs)) * linear.scaling["default"]
        torch.testing.assert_close(inputs @ a.t() @ b.t(), expected, rtol=1e-5, atol=1e-6)


def test_phi3_fused_modules_and_rslora_scale(tmp_path) -> None:
    """qkv_proj is attn_qkv; gate_up_proj is mlp_h_to_4h with lora_B's halves swapped ([up; gate], TensorRT-LLM's fused
    fc); use_rslora scales by lora_alpha / √r."""
    _peft_model("phi3", ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], use_rslora=True).save_pretrained(tmp_path)
    tensors = convert_peft_adapter(tmp_path)
    weights, config = _expected(tmp_path, scale=16 / math.sqrt(4))
    np.testing.assert_array_equal(tensors.config, config)
    np.testing.assert_array_equal(tensors.weights, weights)
    assert sorted({int(m) for m in tensors.config[0, :, 0]}) == [0, 4, 5, 6]


def test_bfloat16_adapters_are_read_without_torch(tmp_path, llama_adapter) -> None:
    """numpy has no bfloat16: those tensors are read from the file's bytes (the same values as torch reads)."""
    directory, _ = llama_adapter
    tensors = load_file(str(directory / "adapter_model.safetensors"))
    for name, dtype in (("bf16", torch.bfloat16), ("f32", torch.float32)):  # the same values, stored two ways
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text((directory / "adapter_config.json").read_text())
        save_file({key: value.to(torch.bfloat16).to(dtype) for key, value in tensors.items()}, str(tmp_path / name / "adapter_model.safetensors"))
    converted = convert_peft_adapter(tmp_path / "bf16", dtype="float32")
    np.testing.assert_array_equal(converted.weights, convert_peft_adapter(tmp_path / "f32", dtype="float32").weights)
    assert converted.weights.any()


def test_write_and_read_back_the_files_nvidias_client_reads(tmp_path, llama_adapter) -> None:
    tensors = convert_peft_adapter(llama_adapter[0])
    weights_file, config_file = write_lora_tensors(tensors, tmp_path / "out")
    assert (weights_file.name, config_file.name) == ("model.lora_weights.npy", "model.lora_config.npy") == (WEIGHTS_FILE, CONFIG_FILE)
    again = read_lora_tensors(tmp_path / "out")
    np.testing.assert_array_equal(again.weights, tensors.weights)
    np.testing.assert_array_equal(again.config, tensors.config)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"use_dora": True}, "use_dora is set"),
        ({"rank_pattern": {"q_proj": 8}}, "rank_pattern is set"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save is set"),
        ({"peft_type": "PREFIX_TUNING"}, "not a LoRA adapter"),
        ({"r": 8}, "are not [r, in] and [out, r] with r = 8"),
    ],
)
def test_adapters_the_layout_cannot_hold_are_refused_by_name(tmp_path, llama_adapter, change, message) -> None:
    directory, _ = llama_adapter
    config = {**json.loads((directory / "adapter_config.json").read_text()), **change}
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    (tmp_path / "adapter_model.safetensors").write_bytes((directory / "adapter_model.safetensors").read_bytes())
    with pytest.raises(LoraAdapterError, match=message.replace("[", r"\[").replace("]", r"\]")):
        convert_peft_adapter(tmp_path)


def test_unknown_modules_and_lone_halves_are_refused(tmp_path, llama_adapter) -> None:
    directory, _ = llama_adapter
    (tmp_path / "adapter_config.json").write_text((directory / "adapter_config.json").read_text())
    expert = {
        "base_model.model.model.layers.0.block_sparse_moe.experts.0.w1.lora_A.weight": torch.zeros(4, 32),
        "base_model.model.model.layers.0.block_sparse_moe.experts.0.w1.lora_B.weight": torch.zeros(64, 4),
    }
    save_file(expert, str(tmp_path / "adapter_model.safetensors"))
    with pytest.raises(LoraAdapterError, match="module w1 has no TensorRT-LLM LoRA module"):
        convert_peft_adapter(tmp_path)
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 32)}, str(tmp_path / "adapter_model.safetensors"))
    with pytest.raises(LoraAdapterError, match="lora_A without its other half"):
        convert_peft_adapter(tmp_path)


def test_cli_writes_the_files_and_refuses_pickled_weights_with_exit_2(tmp_path, llama_adapter, capsys) -> None:
    assert main(["lora", "convert", str(llama_adapter[0]), str(tmp_path / "out")]) == 0
    assert "wrote" in capsys.readouterr().out
    np.testing.assert_array_equal(np.load(tmp_path / "out" / WEIGHTS_FILE), convert_peft_adapter(llama_adapter[0]).weights)
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "adapter_config.json").write_text((llama_adapter[0] / "adapter_config.json").read_text())
    (pickled / "adapter_model.bin").write_bytes(b"not even a pickle: it is never opened")
    assert main(["lora", "convert", str(pickled), str(tmp_path / "out2")]) == 2
    error = capsys.readouterr().err
    assert "adapter_model.bin: pickled weights are never loaded" in error
    assert not (tmp_path / "out2").exists()
    assert main(["lora", "convert", str(tmp_path / "nowhere"), str(tmp_path / "out3")]) == 2
    assert "no adapter_config.json" in capsys.readouterr().err


def test_the_module_ids_are_the_engines() -> None:
    from clients.lora_tensors import LORA_MODULE_IDS
    from refengine.lora.modules import LORA_MODULE_IDS as ENGINE_IDS

    assert dict(LORA_MODULE_IDS) == NVIDIA_IDS
    assert all(ENGINE_IDS[name] == module_id for name, module_id in NVIDIA_IDS.items())
