"""The converter on TensorRT-LLM's GPTForCausalLM families: StarCoder2 and Nemotron (gpt_variant), unquantized and FP8.

ModelOpt 0.47's TRT export writes no `gpt_variant` and no GPT norms with a bias here (its fallback config writer), so the
expected names come from TensorRT-LLM's `models/gpt/convert.py`: `attention.qkv` [q_r; k_r; v_r] (+ bias),
`attention.dense` (+ bias, replicated), `mlp.fc` (StarCoder2 `mlp.c_fc`, Nemotron `mlp.up_proj`; + bias, column),
`mlp.proj` (`mlp.c_proj` / `mlp.down_proj`; + bias, replicated), no `mlp.gate`; `input_layernorm`, `post_layernorm`
and `transformer.ln_f` weight + bias, Nemotron's LayerNorm1P stored with 1 added (`apply_layernorm_1p`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.unified_exports import cached_exports, convert, quantize_and_export

VOCAB, HIDDEN, INTER, HEADS, KV_HEADS = 500, 128, 512, 4, 2
HEAD = HIDDEN // HEADS
FAMILIES = {
    "starcoder2": ("Starcoder2ForCausalLM", {"tie_word_embeddings": True}),  # StarCoder2 ties by default
    "nemotron": ("NemotronForCausalLM", {"tie_word_embeddings": False, "partial_rotary_factor": 0.5}),
}
HF_MLP = {"starcoder2": ("mlp.c_fc", "mlp.c_proj"), "nemotron": ("mlp.up_proj", "mlp.down_proj")}


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory):
    with cached_exports(tmp_path_factory.mktemp("gpt"), _export) as get:
        yield get


def _export(family: str, algo: str, directory: Path) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    architecture, extra = FAMILIES[family]
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        family,
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=256,
        architectures=[architecture],
        bos_token_id=1,
        eos_token_id=2,
        **extra,
    )
    model = AutoModelForCausalLM.from_config(config).to(torch.float16).eval()
    with torch.no_grad():  # random norms: a LayerNorm1P weight of zeros would hide a missing +1
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.normal_(0.0, 0.1)
    return quantize_and_export(model, algo, VOCAB, directory)


def _norm(hf: dict, name: str, family: str) -> torch.Tensor:
    weight = hf[f"{name}.weight"]
    return (weight.float() + 1.0).half() if family == "nemotron" else weight


@pytest.mark.parametrize("family", FAMILIES)
def test_unquantized_weights_round_trip_exactly_over_tp_ranks(family: str, exports, tmp_path: Path) -> None:
    unified = exports(family, "none")
    written = convert(unified, tmp_path / "out", 2)
    hf = load_file(unified / "model.safetensors")
    ranks = [load_file(tmp_path / "out" / f"rank{r}.safetensors") for r in range(2)]
    fc_name, proj_name = HF_MLP[family]
    biased = family == "starcoder2"
    for layer in (0, 1):
        t, h = f"transformer.layers.{layer}.", f"model.layers.{layer}."
        names = {f"{t}{m}.{s}" for m in ("attention.qkv", "attention.dense", "mlp.fc", "mlp.proj") for s in (("weight", "bias") if biased else ("weight",))}
        names |= {f"{t}{n}.{s}" for n in ("input_layernorm", "post_layernorm") for s in ("weight", "bias")}
        for rank in ranks:
            assert {n for n in rank if n.startswith(t)} == names
        for suffix in ("weight", "bias") if biased else ("weight",):
            qkv = [rank[f"{t}attention.qkv.{suffix}"] for rank in ranks]  # per rank [q_r; k_r; v_r]
            for i, p in enumerate("qkv"):
                rows = (HEADS if p == "q" else KV_HEADS) * HEAD // 2
                start = 0 if p == "q" else HEADS * HEAD // 2 + (i - 1) * KV_HEADS * HEAD // 2
                assert torch.equal(torch.cat([r[start : start + rows] for r in qkv]), hf[f"{h}self_attn.{p}_proj.{suffix}"])
            assert torch.equal(torch.cat([rank[f"{t}mlp.fc.{suffix}"] for rank in ranks]), hf[f"{h}{fc_name}.{suffix}"])
        assert torch.equal(torch.cat([rank[f"{t}attention.dense.weight"] for rank in ranks], dim=1), hf[f"{h}self_attn.o_proj.weight"])
        assert torch.equal(torch.cat([rank[f"{t}mlp.proj.weight"] for rank in ranks], dim=1), hf[f"{h}{proj_name}.weight"])
        for rank in ranks:
            if biased:  # row-parallel biases are replicated (TensorRT-LLM adds them after the all-reduce)
                assert torch.equal(rank[f"{t}attention.dense.bias"], hf[f"{h}self_attn.o_proj.bias"])
                assert torch.equal(rank[f"{t}mlp.proj.bias"], hf[f"{h}{proj_name}.bias"])
            for trt, name in (("input_layernorm", "input_layernorm"), ("post_layernorm", "post_attention_layernorm")):
                assert torch.equal(rank[f"{t}{trt}.weight"], _norm(hf, h + name, family))
                assert torch.equal(rank[f"{t}{trt}.bias"], hf[f"{h}{name}.bias"])
    for rank in ranks:
        assert torch.equal(rank["transformer.ln_f.weight"], _norm(hf, "model.norm", family))
        assert torch.equal(rank["transformer.ln_f.bias"], hf["model.norm.bias"])
    embedding = hf["model.embed_tokens.weight"]
    assert torch.equal(torch.cat([rank["transformer.vocab_embedding.weight"] for rank in ranks]), embedding)
    head = hf.get("lm_head.weight", embedding)  # StarCoder2 ties it: the embedding is written as the lm_head
    assert torch.equal(torch.cat([rank["lm_head.weight"] for rank in ranks]), head)
    assert written["gpt_variant"] == family and written["rmsnorm"] is False and written["bias"] is biased
    assert written["hidden_act"] == ("squared-relu" if family == "nemotron" else "gelu")
    assert written["rotary_pct"] == (0.5 if family == "nemotron" else 1.0)
    assert written["quantization"] == {"quant_algo": None, "kv_cache_quant_algo": None}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tp", [1, 2])
def test_fp8_structure(family: str, tp: int, exports, tmp_path: Path) -> None:
    written = convert(exports(family, "fp8"), tmp_path / "out", tp)
    biased = family == "starcoder2"
    shapes = {
        "attention.qkv": ((HEADS + 2 * KV_HEADS) * HEAD // tp, HIDDEN),
        "attention.dense": (HIDDEN, HIDDEN // tp),
        "mlp.fc": (INTER // tp, HIDDEN),
        "mlp.proj": (HIDDEN, INTER // tp),
    }
    for r in range(tp):
        rank = load_file(tmp_path / "out" / f"rank{r}.safetensors")
        t = "transformer.layers.0."
        for linear, shape in shapes.items():
            assert (rank[f"{t}{linear}.weight"].dtype, tuple(rank[f"{t}{linear}.weight"].shape)) == (torch.float8_e4m3fn, shape)
            for scale in ("weights_scaling_factor", "activation_scaling_factor"):
                assert (rank[f"{t}{linear}.{scale}"].dtype, rank[f"{t}{linear}.{scale}"].shape) == (torch.float32, (1,))
            assert (f"{t}{linear}.bias" in rank) is biased
            if biased:
                assert rank[f"{t}{linear}.bias"].dtype == torch.float16
        assert f"{t}mlp.gate.weight" not in rank
        for norm in ("input_layernorm", "post_layernorm"):
            assert rank[f"{t}{norm}.weight"].dtype == rank[f"{t}{norm}.bias"].dtype == torch.float16
        assert rank[f"{t}attention.kv_cache_scaling_factor"].shape == (1,)
        assert rank["lm_head.weight"].dtype == torch.float16
    quantization = written["quantization"]
    assert (quantization["quant_algo"], quantization["kv_cache_quant_algo"]) == ("FP8", "FP8")
    assert "lm_head" in quantization["exclude_modules"]
