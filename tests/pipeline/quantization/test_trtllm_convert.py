"""The project's converter (unified HF checkpoint -> TensorRT-LLM checkpoint) against ModelOpt 0.47's own TRT export.

For tiny random Llama, Qwen2, Qwen3 and Gemma models and every CPU weight format, one calibrated model is exported twice: with
ModelOpt's deprecated `export_tensorrt_llm_checkpoint` (the reference) and, from a copy taken before that export (it
changes the model: `preprocess_linear_fusion` shares the q/k/v scales), with `unified_export.export_unified_checkpoint`
(what the quantize job now runs), which `convert_unified_checkpoint` turns into a TensorRT-LLM checkpoint.

What must agree: config.json as a whole, and per rank the tensor names, shapes and dtypes; values bit for bit, except
  * FP8 weights: the unified export rounds (weight / scale) in another order, and q/k/v, gate/up are re-quantized to
    their shared (max) scale here, so codes may differ by one FP8 step;
  * AWQ: the unified export folds the q/k/v and gate/up pre-quant scale into the norm before them: compared as the
    product norm weight × pre-quant scale (fp16 rounding); and it also averages gate/up's AWQ scales (ModelOpt's TRT
    export leaves them apart: layer_utils.build_mlp_config fuses gate/up only for FP8/NVFP4), so their codes and
    scales are a different quantization of the same weights: compared as effective weights (cosine);
  * FP8 KV-cache scales: that export clamps them to >= 1.0, the converter does not (compared clamped).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipeline.errors import StageError
from pipeline.quantization.trtllm_checkpoint.convert import convert_unified_checkpoint
from pipeline.quantization.trtllm_checkpoint.pretrained import pretrained_config
from pipeline.quantization.trtllm_checkpoint.reverse import trtllm_to_hf_state_dict

VOCAB = 500  # not a multiple of 64: the AWQ formats pad it
_GEMMA = {"head_dim": 64, "tie_word_embeddings": True}
# family -> (architecture, ModelOpt decoder_type of its TRT export or None where that export refuses it, config extras)
FAMILIES = {
    "llama": ("LlamaForCausalLM", "llama", {"tie_word_embeddings": False}),
    "qwen2": ("Qwen2ForCausalLM", "qwen", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3ForCausalLM", "qwen", {"head_dim": 64, "tie_word_embeddings": False}),
    "gemma": ("GemmaForCausalLM", "gemma", _GEMMA),
    "granite": ("GraniteForCausalLM", None, {"tie_word_embeddings": False}),
    "gemma2": ("Gemma2ForCausalLM", None, _GEMMA),
    "gemma3_text": ("Gemma3ForCausalLM", None, _GEMMA),
    "phi3": ("Phi3ForCausalLM", None, {"tie_word_embeddings": False, "pad_token_id": 0}),
}


@dataclass(frozen=True)
class Case:
    family: str
    algo: str  # a quantize.algo value
    kv: str = "none"
    tp: int = 1
    pp: int = 1
    vocab: int = VOCAB

    @property
    def id(self) -> str:
        vocab = "" if self.vocab == VOCAB else f"-vocab{self.vocab}"
        return f"{self.family}-{self.algo}-kv_{self.kv}-tp{self.tp}-pp{self.pp}{vocab}"


CASES = [
    Case("llama", "none", tp=2, pp=2),
    Case("llama", "fp8", "fp8", tp=2),
    Case("llama", "int8_sq", "int8", pp=2),
    Case("llama", "int8_wo"),
    Case("llama", "int4_awq", tp=2),
    Case("llama", "w4a8_awq", "fp8"),
    Case("llama", "fp8", tp=4),  # tp > num_key_value_heads: K/V heads repeated
    Case("qwen2", "none", "int8"),
    Case("qwen2", "fp8"),
    Case("qwen2", "int8_sq", tp=2),
    Case("qwen2", "int8_wo", "fp8", pp=2),
    Case("qwen2", "int4_awq", pp=2),
    Case("qwen2", "w4a8_awq", tp=2),
    Case("qwen3", "none", tp=2),
    Case("qwen3", "fp8", "fp8", pp=2),
    Case("qwen3", "int4_awq"),
    Case("gemma", "none"),
    Case("gemma", "fp8", tp=2),
    Case("gemma", "int8_sq", "int8", tp=2),
    # ModelOpt's TRT export cannot pad a tied (absent) lm_head for AWQ (postprocess.pad_embedding_lm_head): no padding
    Case("gemma", "int4_awq", tp=2, vocab=512),
]
# Families ModelOpt 0.47's TRT export refuses without tensorrt_llm (NotImplementedError) or does not know
UNREFERENCED = [Case(family, algo) for family in ("granite", "gemma2", "gemma3_text", "phi3") for algo in ("none", "fp8")]


@dataclass
class Exported:
    reference: Path  # ModelOpt's TensorRT-LLM export
    unified: Path
    converted: Path
    config: dict


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("convert")
    made: dict[Case, Exported] = {}

    def get(case: Case) -> Exported:
        if case not in made:
            made[case] = _export(case, root / case.id)
        return made[case]

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield get
    torch.set_num_threads(previous)


def _tiny_model(family: str, vocab: int = VOCAB):
    from transformers import AutoConfig, AutoModelForCausalLM

    architecture, _, extra = FAMILIES[family]
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        family,
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        architectures=[architecture],
        **extra,
    )
    return AutoModelForCausalLM.from_config(config).to(torch.float16).eval()


def _export(case: Case, root: Path) -> Exported:
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    from pipeline.quantization.modelopt_export import QuantRecipe, _mtq_config, _needs_ptq
    from pipeline.quantization.unified_export import export_unified_checkpoint

    model = _tiny_model(case.family, case.vocab)
    recipe = QuantRecipe(case.algo, case.kv)
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, case.vocab, (2, 64), generator=generator) for _ in range(2)]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        if _needs_ptq(recipe):
            model = mtq.quantize(model, _mtq_config(recipe), lambda m: [m(b) for b in batches])
        unified_model = copy.deepcopy(model)
        decoder = FAMILIES[case.family][1]
        if decoder:
            export_tensorrt_llm_checkpoint(
                model,
                decoder,
                dtype=torch.float16,
                export_dir=root / "reference",
                inference_tensor_parallel=case.tp,
                inference_pipeline_parallel=case.pp,
            )
        export_unified_checkpoint(unified_model, root / "unified", dtype=torch.float16)
    hf = json.loads((root / "unified" / "config.json").read_text())
    mapping = {"world_size": case.tp * case.pp, "tp_size": case.tp, "pp_size": case.pp}
    config = pretrained_config(hf, dtype="float16", mapping=mapping, quantization={})
    if case.algo == "int8_wo":  # exported unquantized; trtllm-build quantizes (quant_formats.WEIGHT_FORMATS)
        config["quantization"] = {"quant_algo": "W8A16"}
    written = convert_unified_checkpoint(root / "unified", root / "converted", config=config, tp_size=case.tp, pp_size=case.pp)
    return Exported(root / "reference", root / "unified", root / "converted", written)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_converter_writes_what_modelopts_trtllm_export_wrote(case: Case, exports) -> None:
    exported = exports(case)
    expected = json.loads((exported.reference / "config.json").read_text())
    if case.algo == "int8_wo":
        expected["quantization"]["quant_algo"] = "W8A16"  # what modelopt_export patched in
    assert json.loads((exported.converted / "config.json").read_text()) == exported.config
    _assert_config_agrees(case, exported.config, expected)
    ranks = sorted(p.name for p in exported.reference.glob("rank*.safetensors"))
    assert sorted(p.name for p in exported.converted.glob("rank*.safetensors")) == ranks
    assert len(ranks) == case.tp * case.pp
    for rank in ranks:
        reference, converted = load_file(exported.reference / rank), load_file(exported.converted / rank)
        assert sorted(converted) == sorted(reference), rank
        for name in reference:
            assert (converted[name].dtype, converted[name].shape) == (reference[name].dtype, reference[name].shape), name
        _assert_values(case, reference, converted, rank)


# Keys pretrained_config writes that ModelOpt's fallback config writer does not (ModelOpt 0.47's model_config_export.py: without
# tensorrt_llm it writes no family keys, and under transformers 5 no rotary_base)
_FAMILY_KEYS = {
    "llama": {"attn_bias", "mlp_bias", "rotary_base"},
    "qwen2": {
        "attn_bias",
        "mlp_bias",
        "rotary_base",
        "qwen_type",
        "qk_layernorm",
        "seq_length",
        "use_logn_attn",
        "moe",
        "moe_intermediate_size",
        "moe_shared_expert_intermediate_size",
        "disable_weight_only_quant_plugin",
        "tie_word_embeddings",
    },
    "gemma": {"attn_bias", "mlp_bias", "rotary_base", "inter_layernorms"},
}
_FAMILY_KEYS["qwen3"] = _FAMILY_KEYS["qwen2"]


def _assert_config_agrees(case: Case, written: dict, reference: dict) -> None:
    """Every key ModelOpt's TRT export writes has its value, but `producer` and `rank` (ModelOpt writes config.json from
    its last rank; TensorRT-LLM sets the rank when it loads a rank file); the rest are the family's own keys."""
    differ = {k: (reference[k], written.get(k)) for k in reference if k not in ("producer", "rank") and written.get(k) != reference[k]}
    if case.family == "gemma" and case.tp == 1:  # GemmaConfig: a parallel embedding only when there is TP to split over
        assert differ.pop("use_parallel_embedding") == (True, False)
    assert differ == {}
    assert set(written) - set(reference) == _FAMILY_KEYS[case.family]


def _assert_values(case: Case, reference: dict, converted: dict, rank: str) -> None:
    awq = case.algo in ("int4_awq", "w4a8_awq")
    checked = set()
    if awq:
        checked |= _assert_awq(reference, converted)
    for name, ref in reference.items():
        if name in checked:
            continue
        got = converted[name]
        if case.kv == "fp8" and name.endswith("_cache_scaling_factor"):
            # ModelOpt 0.47's TRT export clamps FP8 KV scales to >= 1.0; the converter writes the unified export's raw
            # amax / 448 (convert.py `_kv_cache_scales`; measured: BENCHMARKS.md#fp8-kv-cache-scales-clamped-or-raw-cpu-issue-41).
            assert torch.equal(ref, got.clamp(min=1.0)), f"{rank}: {name}"
        elif ref.dtype == torch.float8_e4m3fn:
            assert _fp8_code_distance(ref, got) <= 1, f"{rank}: {name}"
        else:
            assert torch.equal(ref, got), f"{rank}: {name} differs"


def _assert_awq(reference: dict, converted: dict) -> set[str]:
    """The AWQ tensors the unified export folds or re-smooths (see the module doc); returns the names it checked."""
    checked = set()
    layers = sorted({n.split(".")[2] for n in reference if n.startswith("transformer.layers.")})
    for layer in layers:
        p = f"transformer.layers.{layer}."
        for norm, linears in (("input_layernorm", ["attention.qkv"]), ("post_layernorm", ["mlp.fc", "mlp.gate"])):
            for linear in linears:
                pre = f"{p}{linear}.prequant_scaling_factor"
                assert torch.equal(converted[pre], torch.ones_like(converted[pre])), pre
                want = reference[f"{p}{norm}.weight"].float() * reference[pre].float()
                if linear == "attention.qkv":  # same averaged scale in both exports: only the fold's fp16 rounding
                    torch.testing.assert_close(converted[f"{p}{norm}.weight"].float(), want, rtol=2e-3, atol=1e-5)
                else:
                    cosine = torch.nn.functional.cosine_similarity(
                        _int4_effective(converted, p + linear, converted[f"{p}{norm}.weight"].float()).flatten(),
                        _int4_effective(reference, p + linear, want).flatten(),
                        dim=0,
                    )
                    assert cosine > 0.97, f"{p}{linear}: cosine {cosine:.4f}"
                    checked |= {n for n in reference if n.startswith(f"{p}{linear}.")}
                checked |= {pre, f"{p}{norm}.weight"}
    return checked


def _int4_effective(tensors: dict, prefix: str, column_scale: torch.Tensor) -> torch.Tensor:
    """Dequantized INT4 weight [out, in] times the per-input factor in front of it."""
    packed = tensors[f"{prefix}.weight"].view(torch.uint8).int()
    low, high = packed & 0xF, packed >> 4
    codes = torch.stack([low, high], dim=1).flatten(0, 1)  # byte row r holds output rows 2r (low) and 2r+1 (high)
    codes = torch.where(codes >= 8, codes - 16, codes).float()
    scale = tensors[f"{prefix}.weights_scaling_factor"]
    group = codes.shape[1] // scale.shape[1]
    return codes * scale.repeat_interleave(group, dim=1) * column_scale


def _fp8_code_distance(a: torch.Tensor, b: torch.Tensor) -> int:
    def ordinal(t: torch.Tensor) -> torch.Tensor:  # E4M3 codes are ordered by magnitude within a sign
        bits = t.view(torch.uint8).int()
        return torch.where(bits >= 128, -(bits & 0x7F), bits)

    return int((ordinal(a) - ordinal(b)).abs().max())


def test_unquantized_weights_round_trip_exactly(exports) -> None:
    """TP 2 × PP 2 shards read back (trtllm_checkpoint) into the Hugging Face tensors bit for bit."""
    exported = exports(CASES[0])
    _, state = trtllm_to_hf_state_dict(exported.converted)
    original = load_file(exported.unified / "model.safetensors")
    assert sorted(state) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(state[name], tensor), name


def test_a_recipe_the_unified_checkpoint_does_not_hold_is_refused(exports, tmp_path: Path) -> None:
    exported = exports(Case("qwen2", "fp8"))
    config = {**exported.config, "quantization": {"quant_algo": "W4A16_AWQ"}}
    with pytest.raises(StageError, match=r"hf_quant_config.json: quant_algo is 'FP8', but the TensorRT-LLM config asks for 'W4A16_AWQ'"):
        convert_unified_checkpoint(exported.unified, tmp_path / "out", config=config, tp_size=1, pp_size=1)


def test_per_channel_kv_scales_are_not_repeated_over_tp_ranks(exports, tmp_path: Path) -> None:
    exported = exports(Case("qwen2", "int8_sq", tp=2))
    with pytest.raises(StageError, match=r"self_attn.k_proj: per-channel scales of KV heads cannot be repeated"):
        convert_unified_checkpoint(exported.unified, tmp_path / "out", config=exported.config, tp_size=4, pp_size=1)


# -- families ModelOpt's TRT export cannot write here: names and shapes from TensorRT-LLM's conversion facts ---------
def _expected_unquantized(family: str, hf: dict) -> dict:
    """The TensorRT-LLM tensors of layer 0 and the top, from the Hugging Face tensors (tp 1, pp 1)."""
    plus_one = family.startswith("gemma")

    def norm(name: str) -> torch.Tensor:
        weight = hf[f"{name}.weight"]
        return (weight.float() + 1.0).half() if plus_one else weight

    a, m = "model.layers.0.self_attn.", "model.layers.0.mlp."
    if family == "phi3":
        qkv = hf[a + "qkv_proj.weight"]
        gate, up = hf[m + "gate_up_proj.weight"].chunk(2)
    else:
        qkv = torch.cat([hf[a + f"{p}_proj.weight"] for p in "qkv"])
        gate, up = hf[m + "gate_proj.weight"], hf[m + "up_proj.weight"]
    t = "transformer.layers.0."
    # Phi-3's plain MLP: one fc of rows [up; gate] (models/phi3/convert.py); the others' GatedMLP: fc = gate, gate = up
    mlp = {t + "mlp.fc.weight": torch.cat([up, gate])} if family == "phi3" else {t + "mlp.fc.weight": gate, t + "mlp.gate.weight": up}
    expected = {
        t + "attention.qkv.weight": qkv,
        t + "attention.dense.weight": hf[a + "o_proj.weight"],
        **mlp,
        t + "mlp.proj.weight": hf[m + "down_proj.weight"],
        t + "input_layernorm.weight": norm("model.layers.0.input_layernorm"),
        t + "post_layernorm.weight": norm("model.layers.0.post_attention_layernorm"),
        "transformer.vocab_embedding.weight": hf["model.embed_tokens.weight"],
        "transformer.ln_f.weight": norm("model.norm"),
    }
    if family in ("gemma2", "gemma3_text"):
        for name in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
            expected[t + name + ".weight"] = norm(f"model.layers.0.{name}")
    if family == "gemma3_text":
        expected[t + "attention.q_layernorm.weight"] = norm(a + "q_norm")
        expected[t + "attention.k_layernorm.weight"] = norm(a + "k_norm")
    if not plus_one:
        expected["lm_head.weight"] = hf["lm_head.weight"]
    return expected


@pytest.mark.parametrize("case", UNREFERENCED, ids=lambda c: c.id)
def test_families_without_a_modelopt_trt_export(case: Case, exports) -> None:
    exported = exports(case)
    converted = load_file(exported.converted / "rank0.safetensors")
    hf = load_file(exported.unified / "model.safetensors")
    layer0 = {n: t for n, t in converted.items() if not n.startswith("transformer.layers.1.")}
    linears = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.proj") + (() if case.family == "phi3" else ("mlp.gate",))
    if case.algo == "none":
        expected = _expected_unquantized(case.family, hf)
        assert sorted(layer0) == sorted(expected)
        for name, tensor in expected.items():
            assert torch.equal(layer0[name], tensor), name
        assert exported.config["quantization"] == {"quant_algo": None, "kv_cache_quant_algo": None}
    else:
        for linear in linears:
            p = f"transformer.layers.0.{linear}."
            assert layer0[p + "weight"].dtype == torch.float8_e4m3fn
            assert layer0[p + "weights_scaling_factor"].shape == layer0[p + "activation_scaling_factor"].shape == (1,)
        assert exported.config["quantization"] == {"quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}
