"""HF Llama -> TensorRT-LLM checkpoint through ModelOpt 0.47, and back (pipeline/quantization/modelopt_export.py).

ModelOpt is imported once per process (~6 s); each export of the tiny model takes well under a second,
so the exports are cached per module and shared between tests.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import GPT2Config, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from pipeline.errors import ArtifactError, StageError
from pipeline.quantization.modelopt_export import QuantRecipe, export_trtllm_checkpoint
from pipeline.quantization.trtllm_checkpoint.pretrained import rope_fields
from pipeline.quantization.trtllm_checkpoint.reverse import trtllm_to_hf_state_dict

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB = 256, 768, 4, 4, 2, 512
HEAD = HIDDEN // HEADS
ROPE_THETA = 500000.0  # not the TRT-LLM default 10000, so a dropped rotary_base shows


def _tiny_llama_config(**extra) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=2048,
        rope_theta=ROPE_THETA,
        tie_word_embeddings=False,
        **extra,
    )


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(_tiny_llama_config()).to(torch.float16).save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def export(hf_dir, tmp_path_factory):
    """export(dtype=..., tp=..., pp=...) -> (checkpoint dir, returned config), cached per module."""
    cache: dict[tuple, tuple[Path, dict]] = {}

    def run(dtype: str = "float16", tp: int = 1, pp: int = 1) -> tuple[Path, dict]:
        if (dtype, tp, pp) not in cache:
            out = tmp_path_factory.mktemp(f"trtllm-{dtype}-tp{tp}-pp{pp}")
            cache[dtype, tp, pp] = out, export_trtllm_checkpoint(hf_dir, out, dtype=dtype, tp_size=tp, pp_size=pp)
        return cache[dtype, tp, pp]

    return run


@pytest.fixture(scope="module")
def original(hf_dir) -> dict[str, torch.Tensor]:
    return load_file(hf_dir / "model.safetensors")


def _logits(state_dict: dict[str, torch.Tensor], config) -> torch.Tensor:
    model = LlamaForCausalLM(config).float().eval()
    model.load_state_dict(state_dict, strict=True)
    tokens = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(tokens).logits.flatten()


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0).item()


# --- single rank ----------------------------------------------------------------------------------


def test_config_has_the_trtllm_fields(export):
    out, config = export()
    assert json.loads((out / "config.json").read_text()) == config
    expected = {
        "architecture": "LlamaForCausalLM",
        "dtype": "float16",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "intermediate_size": INTER,
        "hidden_act": "silu",
        "norm_epsilon": 1e-6,
        "position_embedding_type": "rope_gpt_neox",
        "max_position_embeddings": 2048,
        "rotary_base": ROPE_THETA,
        "head_size": HEAD,
    }
    assert {k: config.get(k) for k in expected} == expected
    assert config["mapping"] == {"world_size": 1, "tp_size": 1, "pp_size": 1}
    assert config["quantization"]["quant_algo"] is None
    assert config["quantization"]["kv_cache_quant_algo"] is None
    assert "rotary_scaling" not in config
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "rank0.safetensors"]  # no quant_cfg.json


def test_tensor_names_and_shapes(export):
    out, _ = export()
    weights = load_file(out / "rank0.safetensors")
    expected = {
        "transformer.vocab_embedding.weight": (VOCAB, HIDDEN),
        "transformer.ln_f.weight": (HIDDEN,),
        "lm_head.weight": (VOCAB, HIDDEN),
    }
    for i in range(LAYERS):
        p = f"transformer.layers.{i}."
        expected |= {
            p + "input_layernorm.weight": (HIDDEN,),
            p + "post_layernorm.weight": (HIDDEN,),
            p + "attention.qkv.weight": ((HEADS + 2 * KV_HEADS) * HEAD, HIDDEN),
            p + "attention.dense.weight": (HIDDEN, HIDDEN),
            p + "mlp.fc.weight": (INTER, HIDDEN),
            p + "mlp.gate.weight": (INTER, HIDDEN),
            p + "mlp.proj.weight": (HIDDEN, INTER),
        }
    assert {k: tuple(v.shape) for k, v in weights.items()} == expected
    assert {v.dtype for v in weights.values()} == {torch.float16}


def test_name_map_matches_the_hf_weights(export, original):
    out, _ = export()
    weights = load_file(out / "rank0.safetensors")
    layer = "model.layers.1."
    assert torch.equal(weights["transformer.layers.1.mlp.fc.weight"], original[layer + "mlp.gate_proj.weight"])
    assert torch.equal(weights["transformer.layers.1.mlp.gate.weight"], original[layer + "mlp.up_proj.weight"])
    qkv = torch.cat([original[layer + f"self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(weights["transformer.layers.1.attention.qkv.weight"], qkv)


def test_round_trip_reproduces_weights_and_logits(export, hf_dir, original):
    out, _ = export()
    _, state = trtllm_to_hf_state_dict(out)
    assert state.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(state[name], tensor), name
    config = LlamaConfig.from_pretrained(hf_dir)
    assert _cosine(_logits(state, config), _logits(original, config)) >= 0.9999


def test_bfloat16_export(export, hf_dir, original):
    out, config = export(dtype="bfloat16")
    assert config["dtype"] == "bfloat16"
    assert {v.dtype for v in load_file(out / "rank0.safetensors").values()} == {torch.bfloat16}
    _, state = trtllm_to_hf_state_dict(out)
    hf_config = LlamaConfig.from_pretrained(hf_dir)
    assert _cosine(_logits(state, hf_config), _logits(original, hf_config)) >= 0.9999


# --- tensor and pipeline parallel -----------------------------------------------------------------


def test_tp2_writes_two_correctly_split_ranks(export):
    full = load_file(export()[0] / "rank0.safetensors")
    out, config = export(tp=2)
    assert config["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}
    assert sorted(p.name for p in out.glob("rank*.safetensors")) == ["rank0.safetensors", "rank1.safetensors"]
    r0, r1 = (load_file(out / f"rank{r}.safetensors") for r in (0, 1))
    assert r0.keys() == r1.keys() == full.keys()
    for name, tensor in full.items():
        if name.endswith(("attention.dense.weight", "mlp.proj.weight")):  # row-parallel
            assert torch.equal(torch.cat([r0[name], r1[name]], dim=1), tensor), name
        elif name.endswith("layernorm.weight") or name == "transformer.ln_f.weight":  # replicated
            assert torch.equal(r0[name], tensor) and torch.equal(r1[name], tensor), name
        elif not name.endswith("attention.qkv.weight"):  # column-parallel, incl. embedding and lm_head
            assert torch.equal(torch.cat([r0[name], r1[name]], dim=0), tensor), name
    # qkv: every rank holds [q_r; k_r; v_r], so concatenating the ranks is not the full qkv
    name = "transformer.layers.0.attention.qkv.weight"
    q, k, v = full[name].split([HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD])
    for rank, shard in enumerate((r0, r1)):
        assert torch.equal(shard[name], torch.cat([t.chunk(2)[rank] for t in (q, k, v)])), rank
    assert not torch.equal(torch.cat([r0[name], r1[name]]), full[name])


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2), (2, 2), (4, 1)])
def test_sharded_checkpoint_reads_back_to_the_full_weights(export, original, tp, pp):
    """(4, 1): more TP ranks than KV heads, so ModelOpt repeats each KV head on two ranks."""
    out, config = export(tp=tp, pp=pp)
    assert config["mapping"] == {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}
    assert len(list(out.glob("rank*.safetensors"))) == tp * pp
    _, state = trtllm_to_hf_state_dict(out)
    assert state.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(state[name], tensor), name


def test_pp2_splits_the_layers_across_ranks(export):
    full = load_file(export()[0] / "rank0.safetensors")
    out, config = export(pp=2)
    assert config["num_hidden_layers"] == LAYERS
    first, last = (load_file(out / f"rank{r}.safetensors") for r in (0, 1))
    layers = lambda w: sorted({int(k.split(".")[2]) for k in w if k.startswith("transformer.layers.")})  # noqa: E731
    assert layers(first) == layers(last) == [0, 1]  # numbered from 0 on every stage
    assert "transformer.vocab_embedding.weight" in first and "lm_head.weight" not in first
    assert "transformer.ln_f.weight" not in first
    assert {"lm_head.weight", "transformer.ln_f.weight"} <= last.keys()
    assert "transformer.vocab_embedding.weight" not in last
    for name, tensor in last.items():
        if name.startswith("transformer.layers."):
            local = int(name.split(".")[2])
            assert torch.equal(tensor, full[name.replace(f"layers.{local}.", f"layers.{local + 2}.", 1)]), name


def test_qwen2_with_qkv_bias_and_tied_embeddings(tmp_path):
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config).to(torch.float16)
    with torch.no_grad():
        for layer in model.model.layers:  # random init leaves the biases at zero
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_()
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    trt = export_trtllm_checkpoint(tmp_path / "hf", tmp_path / "trt", dtype="float16", tp_size=2, pp_size=1)
    assert trt["qwen_type"] == "qwen2" and trt["rotary_base"] == config.rope_parameters["rope_theta"]
    _, state = trtllm_to_hf_state_dict(tmp_path / "trt")
    expected = {k: v for k, v in model.state_dict().items()}
    assert state.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name


# --- quantized formats ----------------------------------------------------------------------------


def test_fp8_with_fp8_kv_cache(hf_dir, tmp_path):
    batches = [torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    config = export_trtllm_checkpoint(
        hf_dir,
        tmp_path,
        dtype="float16",
        tp_size=1,
        pp_size=1,
        quant=QuantRecipe("fp8", "fp8", 128),
        forward_loop=lambda m: [m(b) for b in batches],
    )
    assert config["quantization"]["quant_algo"] == "FP8"
    assert config["quantization"]["kv_cache_quant_algo"] == "FP8"
    weights = load_file(tmp_path / "rank0.safetensors")
    assert weights["transformer.layers.0.attention.qkv.weight"].dtype == torch.float8_e4m3fn
    assert weights["transformer.layers.0.attention.kv_cache_scaling_factor"].shape == (1,)
    assert weights["lm_head.weight"].dtype == torch.float16  # excluded from quantization
    with pytest.raises(ArtifactError, match="only unquantized"):
        trtllm_to_hf_state_dict(tmp_path)


def test_int8_weight_only_exports_float_weights_with_w8a16(hf_dir, tmp_path, original):
    """Like TensorRT-LLM's quantize.py: trtllm-build quantizes the weights; no calibration needed."""
    config = export_trtllm_checkpoint(hf_dir, tmp_path, dtype="float16", tp_size=1, pp_size=1, quant=QuantRecipe("int8_wo"))
    assert config["quantization"]["quant_algo"] == "W8A16"
    _, state = trtllm_to_hf_state_dict(tmp_path)
    assert all(torch.equal(state[k], v) for k, v in original.items())


def test_awq_group_size_reaches_the_modelopt_config():
    from pipeline.quantization.modelopt_export import _mtq_config

    for algo in ("int4_awq", "w4a8_awq"):
        entries = _mtq_config(QuantRecipe(algo, "none", 64))["quant_cfg"]
        (weight,) = [e for e in entries if e.get("quantizer_name") == "*weight_quantizer"]
        cfg = weight["cfg"][0] if isinstance(weight["cfg"], list) else weight["cfg"]
        assert cfg["block_sizes"][-1] == 64, algo
    import modelopt.torch.quantization as mtq

    assert mtq.INT4_AWQ_CFG["quant_cfg"][1]["cfg"]["block_sizes"][-1] == 128  # the shared default is untouched


def test_quantization_without_calibration_data_is_refused(hf_dir, tmp_path):
    with pytest.raises(StageError, match="needs calibration batches"):
        export_trtllm_checkpoint(hf_dir, tmp_path, dtype="float16", tp_size=1, pp_size=1, quant=QuantRecipe("fp8"))


# --- errors (no ModelOpt work) --------------------------------------------------------------------


def test_unsupported_architecture(tmp_path):
    GPT2Config(n_layer=2, n_embd=64, n_head=2, architectures=["GPT2LMHeadModel"]).save_pretrained(tmp_path)
    with pytest.raises(StageError, match="gpt2") as info:
        export_trtllm_checkpoint(tmp_path, tmp_path / "out", dtype="float16", tp_size=1, pp_size=1)
    assert "GPT2LMHeadModel" in info.value.message
    assert "supported: llama, mistral, qwen2" in info.value.message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"tp_size": 3}, "num_attention_heads 4 is not divisible by tp_size 3"),
        ({"tp_size": 8}, "num_attention_heads 4 is not divisible by tp_size 8"),
        ({"pp_size": 3}, "num_hidden_layers 4 is not divisible by pp_size 3"),
        ({"tp_size": 0}, "must be >= 1"),
        ({"dtype": "float32"}, "dtype 'float32'"),
        ({"quant": QuantRecipe("int3")}, "algo 'int3'"),
    ],
)
def test_invalid_requests_fail_before_modelopt(hf_dir, tmp_path, kwargs, needle):
    args = {"dtype": "float16", "tp_size": 1, "pp_size": 1} | kwargs
    with pytest.raises(StageError, match=needle):
        export_trtllm_checkpoint(hf_dir, tmp_path, **args)
    assert list(tmp_path.iterdir()) == []


def test_missing_safetensors_is_a_load_error(hf_dir, tmp_path):
    shutil.copy(hf_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(StageError, match="^load: "):
        export_trtllm_checkpoint(tmp_path, tmp_path / "out", dtype="float16", tp_size=1, pp_size=1)


def test_the_unified_export_is_converted_from_a_scratch_directory_it_removes(export):
    out, _ = export()
    assert not out.with_name(out.name + ".unified-hf").exists()
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "rank0.safetensors"]


def test_unified_only_writes_the_unified_checkpoint_alone(tmp_path):
    """The llmapi target's families outside TensorRT-LLM's MODEL_MAP (here GPT-OSS) get their unified checkpoint only;
    converting them is refused before any weights load."""
    from tests.support.family_models import make_family_checkpoint

    hf = make_family_checkpoint("gpt_oss", tmp_path / "hf")
    with pytest.raises(StageError, match=r"model_type 'gpt_oss' \(GptOssForCausalLM\) is not supported by the TensorRT-LLM"):
        export_trtllm_checkpoint(hf, tmp_path / "trt", dtype="bfloat16", tp_size=1, pp_size=1)
    result = export_trtllm_checkpoint(hf, tmp_path / "trt", dtype="bfloat16", tp_size=1, pp_size=1, unified_hf_dir=tmp_path / "unified", unified_only=True)
    assert result == {"quantization": {"quant_algo": None, "kv_cache_quant_algo": None}}
    assert not (tmp_path / "trt").exists()
    assert (tmp_path / "unified" / "config.json").is_file() and (tmp_path / "unified" / "tokenizer.json").is_file()
    saved, unified = load_file(hf / "model.safetensors"), load_file(tmp_path / "unified" / "model.safetensors")
    assert sorted(saved) == sorted(unified) and all(torch.equal(saved[k], unified[k]) for k in saved)


def test_refuses_to_overwrite_a_checkpoint(export, hf_dir):
    out, _ = export()
    with pytest.raises(StageError, match="already holds a checkpoint"):
        export_trtllm_checkpoint(hf_dir, out, dtype="float16", tp_size=1, pp_size=1)


def test_reader_reports_a_missing_rank(export, tmp_path):
    out, _ = export(tp=2)
    shutil.copy(out / "config.json", tmp_path / "config.json")
    shutil.copy(out / "rank0.safetensors", tmp_path / "rank0.safetensors")
    with pytest.raises(ArtifactError, match="missing rank1.safetensors"):
        trtllm_to_hf_state_dict(tmp_path)


def test_rope_fields_from_transformers_5_rope_parameters():
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}
    config = _tiny_llama_config(rope_scaling=dict(llama3))  # transformers adds rope_theta to the dict
    fields = rope_fields(config.to_dict())
    assert fields["rotary_base"] == ROPE_THETA
    assert fields["rotary_scaling"] == {**llama3, "type": "llama3"}
    assert rope_fields(_tiny_llama_config().to_dict()) == {"rotary_base": ROPE_THETA}
