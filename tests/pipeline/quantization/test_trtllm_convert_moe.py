"""The converter on mixture-of-experts families (Mixtral, Qwen2-MoE, Qwen3-MoE): unquantized and FP8 (+ FP8 KV), TP 1/2.

ModelOpt 0.47's own TensorRT-LLM export cannot write these ('Quant…Experts has no len()' under transformers 5), so
the expected layout is TensorRT-LLM's code (pipeline/quantization/trtllm_checkpoint/moe.py says where): the router float32
[E, H] unsharded and excluded from quantization; `mlp.fc` [E, 2·I/tp, H] = per expert [up_r; gate_r]; `mlp.proj`
[E, H, I/tp]; FP8 weight scales (E, 1) with gate/up sharing the max (re-quantized), activation scales [1] (the max
over experts); Qwen2-MoE's shared expert under `mlp.shared_expert.{fc,proj}` and `mlp.shared_expert_gate`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.errors import StageError
from pipeline.quantization.trtllm_checkpoint.convert import convert_unified_checkpoint
from pipeline.quantization.trtllm_checkpoint.pretrained import pretrained_config
from tests.support.unified_exports import cached_exports, convert, quantize_and_export

VOCAB, HIDDEN, EXPERTS, TOP_K, INTER, SHARED = 500, 128, 4, 2, 128, 256
FAMILIES = {
    "mixtral": ("MixtralForCausalLM", {"num_local_experts": EXPERTS, "intermediate_size": INTER}),
    "qwen2_moe": ("Qwen2MoeForCausalLM", {"num_experts": EXPERTS, "moe_intermediate_size": INTER, "shared_expert_intermediate_size": SHARED}),
    "qwen3_moe": ("Qwen3MoeForCausalLM", {"num_experts": EXPERTS, "moe_intermediate_size": INTER, "head_dim": 64}),
}
# family -> (HF block, gate, up, down, router)
HF_NAMES = {
    "mixtral": ("block_sparse_moe", "w1", "w3", "w2", "gate"),
    "qwen2_moe": ("mlp", "gate_proj", "up_proj", "down_proj", "gate"),
    "qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj", "gate"),
}
FP8 = torch.float8_e4m3fn


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory):
    """(family, algo) -> the unified export's directory; conversions are made by the tests (cheap)."""
    with cached_exports(tmp_path_factory.mktemp("moe"), _export) as get:
        yield get


def _export(family: str, algo: str, directory: Path) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    architecture, extra = FAMILIES[family]
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        family,
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        num_experts_per_tok=TOP_K,
        tie_word_embeddings=False,
        architectures=[architecture],
        **extra,
    )
    model = AutoModelForCausalLM.from_config(config).to(torch.float16).eval()
    return quantize_and_export(model, algo, VOCAB, directory)


def _unified(directory: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in directory.glob("*.safetensors"):
        tensors.update(load_file(path))
    return tensors


def _ranks(directory: Path, tp: int) -> list[dict[str, torch.Tensor]]:
    return [load_file(directory / f"rank{r}.safetensors") for r in range(tp)]


CASES = [(family, algo, tp) for family in FAMILIES for algo in ("none", "fp8") for tp in (1, 2)]


@pytest.mark.parametrize(("family", "algo", "tp"), CASES, ids=lambda v: str(v))
def test_names_shapes_and_dtypes_are_tensorrt_llms(family: str, algo: str, tp: int, exports, tmp_path: Path) -> None:
    written = convert(exports(family, algo), tmp_path / "out", tp)
    wdtype = FP8 if algo == "fp8" else torch.float16
    for tensors in _ranks(tmp_path / "out", tp):
        p = "transformer.layers.0."
        mlp = {n: t for n, t in tensors.items() if n.startswith(p + "mlp.")}
        expected = {
            p + "mlp.router.weight": ((EXPERTS, HIDDEN), torch.float32),
            p + "mlp.fc.weight": ((EXPERTS, 2 * INTER // tp, HIDDEN), wdtype),
            p + "mlp.proj.weight": ((EXPERTS, HIDDEN, INTER // tp), wdtype),
        }
        if family == "qwen2_moe":
            expected.update(
                {
                    p + "mlp.shared_expert.fc.weight": ((2 * SHARED // tp, HIDDEN), wdtype),
                    p + "mlp.shared_expert.proj.weight": ((HIDDEN, SHARED // tp), wdtype),
                    p + "mlp.shared_expert_gate.weight": ((1, HIDDEN), torch.float16),
                }
            )
        if algo == "fp8":
            for linear in ("mlp.fc", "mlp.proj"):
                expected[f"{p}{linear}.weights_scaling_factor"] = ((EXPERTS, 1), torch.float32)
                expected[f"{p}{linear}.activation_scaling_factor"] = ((1,), torch.float32)
            if family == "qwen2_moe":
                for linear in ("mlp.shared_expert.fc", "mlp.shared_expert.proj"):
                    expected[f"{p}{linear}.weights_scaling_factor"] = ((1,), torch.float32)
                    expected[f"{p}{linear}.activation_scaling_factor"] = ((1,), torch.float32)
            for kv in ("k", "v", "kv"):
                assert tensors[f"{p}attention.{kv}_cache_scaling_factor"].shape == (1,)
        assert {n: (tuple(t.shape), t.dtype) for n, t in mlp.items()} == expected
    assert written["mapping"] == {"world_size": tp, "tp_size": tp, "pp_size": 1, "moe_tp_size": tp, "moe_ep_size": 1}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_moe_config_block(family: str, exports, tmp_path: Path) -> None:
    written = convert(exports(family, "none"), tmp_path / "out", 1)
    assert written["moe"] == {"num_experts": EXPERTS, "top_k": TOP_K, "normalization_mode": 1 if family == "mixtral" else 0}
    assert written["hidden_act"] == "swiglu"
    if family == "mixtral":
        assert written["architecture"] == "MixtralForCausalLM" and written["intermediate_size"] == INTER
    else:
        assert written["qwen_type"] == family and written["moe_intermediate_size"] == INTER
        assert written["moe_shared_expert_intermediate_size"] == (SHARED if family == "qwen2_moe" else 0)
    assert written["quantization"] == {"quant_algo": None, "kv_cache_quant_algo": None}


@pytest.mark.parametrize("family", FAMILIES)
def test_unquantized_experts_round_trip_exactly_over_tp_ranks(family: str, exports, tmp_path: Path) -> None:
    unified = exports(family, "none")
    convert(unified, tmp_path / "out", 2)
    hf, ranks = _unified(unified), _ranks(tmp_path / "out", 2)
    block, gate, up, down, router = HF_NAMES[family]
    for layer in (0, 1):
        p, h = f"transformer.layers.{layer}.", f"model.layers.{layer}.{block}."
        for rank in ranks:
            assert torch.equal(rank[p + "mlp.router.weight"], hf[h + router + ".weight"].float())
        for e in range(EXPERTS):
            fc = [rank[p + "mlp.fc.weight"][e] for rank in ranks]  # per rank [up_r; gate_r]
            assert torch.equal(torch.cat([f[: INTER // 2] for f in fc]), hf[f"{h}experts.{e}.{up}.weight"])
            assert torch.equal(torch.cat([f[INTER // 2 :] for f in fc]), hf[f"{h}experts.{e}.{gate}.weight"])
            proj = torch.cat([rank[p + "mlp.proj.weight"][e] for rank in ranks], dim=1)
            assert torch.equal(proj, hf[f"{h}experts.{e}.{down}.weight"])
        if family == "qwen2_moe":
            fc = [rank[p + "mlp.shared_expert.fc.weight"] for rank in ranks]
            assert torch.equal(torch.cat([f[: SHARED // 2] for f in fc]), hf[h + "shared_expert.up_proj.weight"])
            assert torch.equal(torch.cat([f[SHARED // 2 :] for f in fc]), hf[h + "shared_expert.gate_proj.weight"])
            proj = torch.cat([rank[p + "mlp.shared_expert.proj.weight"] for rank in ranks], dim=1)
            assert torch.equal(proj, hf[h + "shared_expert.down_proj.weight"])
            for rank in ranks:
                assert torch.equal(rank[p + "mlp.shared_expert_gate.weight"], hf[h + "shared_expert_gate.weight"])


def _within_one_e4m3_step(code: torch.Tensor, value: torch.Tensor) -> bool:
    """`code` (FP8) holds `value` (float, in code units) to within one E4M3 step at its magnitude."""
    magnitude = value.abs().clamp(min=2.0**-6)  # below 2^-6 E4M3 is subnormal, with steps of 2^-9
    step = torch.exp2(torch.floor(torch.log2(magnitude)) - 3)
    return bool(((code.float() - value).abs() <= step).all())


def _scales_apart(unified: Path, out: Path, up: str) -> Path:
    """A copy of `unified` whose up (w3) Linears of experts 0 and 2 (and the shared expert's) are re-quantized to a 1.5x
    scale: ModelOpt 0.47's unified export already gives each expert's gate and up one scale, which a checkpoint from
    elsewhere (or another ModelOpt) need not."""
    shutil.copytree(unified, out)
    for path in out.glob("*.safetensors"):
        tensors = load_file(path)
        for name in [n for n in tensors if n.endswith((f"experts.0.{up}.weight", f"experts.2.{up}.weight", "shared_expert.up_proj.weight"))]:
            scale = tensors[name.replace(".weight", ".weight_scale")]
            wider = scale * 1.5
            tensors[name] = (tensors[name].float() * scale / wider).to(FP8)
            tensors[name.replace(".weight", ".weight_scale")] = wider
        save_file(tensors, str(path), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("variant", ["as-exported", "gate-up-apart"])
def test_fp8_experts_share_one_gate_up_scale_and_requantize_within_one_step(family: str, tp: int, variant: str, exports, tmp_path: Path) -> None:
    unified = exports(family, "fp8")
    if variant == "gate-up-apart":
        unified = _scales_apart(unified, tmp_path / "unified", HF_NAMES[family][2])
    written = convert(unified, tmp_path / "out", tp)
    hf, ranks = _unified(unified), _ranks(tmp_path / "out", tp)
    block, gate, up, down, router = HF_NAMES[family]
    rows, moved = INTER // tp, 0
    for layer in (0, 1):
        p, h = f"transformer.layers.{layer}.", f"model.layers.{layer}.{block}."
        inputs_fc, inputs_proj = [], []
        for e in range(EXPERTS):
            x = f"{h}experts.{e}."
            scales = {n: hf[f"{x}{n}.weight_scale"].float() for n in (gate, up, down)}
            shared = torch.maximum(scales[gate], scales[up])
            moved += int(not torch.equal(scales[gate], scales[up]))
            inputs_fc += [hf[f"{x}{gate}.input_scale"], hf[f"{x}{up}.input_scale"]]
            inputs_proj.append(hf[f"{x}{down}.input_scale"])
            for r, rank in enumerate(ranks):
                assert torch.equal(rank[p + "mlp.fc.weights_scaling_factor"][e], shared.reshape(1))
                assert torch.equal(rank[p + "mlp.proj.weights_scaling_factor"][e], scales[down].reshape(1))
                fc = rank[p + "mlp.fc.weight"][e]
                for half, name in ((fc[:rows], up), (fc[rows:], gate)):
                    dequantized = hf[f"{x}{name}.weight"][r * rows : (r + 1) * rows].float() * scales[name]
                    assert _within_one_e4m3_step(half, dequantized / shared), f"{p}mlp.fc expert {e} rank {r} ({name})"
                proj = hf[f"{x}{down}.weight"].chunk(tp, dim=1)[r]
                assert torch.equal(rank[p + "mlp.proj.weight"][e].view(torch.uint8), proj.view(torch.uint8))
        for rank in ranks:
            assert torch.equal(rank[p + "mlp.fc.activation_scaling_factor"], torch.stack(inputs_fc).max().reshape(1))
            assert torch.equal(rank[p + "mlp.proj.activation_scaling_factor"], torch.stack(inputs_proj).max().reshape(1))
            assert rank[p + "mlp.router.weight"].dtype == torch.float32
            assert torch.equal(rank[p + "mlp.router.weight"], hf[h + router + ".weight"].float())
        if family == "qwen2_moe":
            _assert_shared_expert_fp8(hf, ranks, p, h, tp)
    assert moved == (4 if variant == "gate-up-apart" else 0)  # ModelOpt 0.47 writes them equal
    excluded = written["quantization"]["exclude_modules"]
    assert {f"transformer.layers.{i}.mlp.router" for i in (0, 1)} <= set(excluded)
    if family == "qwen2_moe":
        assert {f"transformer.layers.{i}.mlp.shared_expert_gate" for i in (0, 1)} <= set(excluded)
    assert written["quantization"]["quant_algo"] == "FP8" and written["quantization"]["kv_cache_quant_algo"] == "FP8"


def _assert_shared_expert_fp8(hf: dict, ranks: list, p: str, h: str, tp: int) -> None:
    x, rows = h + "shared_expert.", SHARED // tp
    scales = {n: hf[f"{x}{n}.weight_scale"].float() for n in ("gate_proj", "up_proj", "down_proj")}
    shared = torch.maximum(scales["gate_proj"], scales["up_proj"])
    for r, rank in enumerate(ranks):
        assert torch.equal(rank[p + "mlp.shared_expert.fc.weights_scaling_factor"], shared.reshape(1))
        inputs = torch.maximum(hf[x + "gate_proj.input_scale"], hf[x + "up_proj.input_scale"]).reshape(1)
        assert torch.equal(rank[p + "mlp.shared_expert.fc.activation_scaling_factor"], inputs)
        fc = rank[p + "mlp.shared_expert.fc.weight"]
        for half, name in ((fc[:rows], "up_proj"), (fc[rows:], "gate_proj")):
            dequantized = hf[f"{x}{name}.weight"][r * rows : (r + 1) * rows].float() * scales[name]
            assert _within_one_e4m3_step(half, dequantized / shared), f"{p}mlp.shared_expert.fc rank {r} ({name})"
        assert torch.equal(rank[p + "mlp.shared_expert.proj.weights_scaling_factor"], scales["down_proj"].reshape(1))


def test_other_formats_on_moe_experts_are_refused(exports, tmp_path: Path) -> None:
    unified = exports("qwen3_moe", "none")
    hf = json.loads((unified / "config.json").read_text())
    config = pretrained_config(hf, dtype="float16", mapping={}, quantization={"quant_algo": "W8A16"})
    with pytest.raises(StageError, match=r"experts of qwen3_moe unquantized or FP8 only, not W8A16"):
        convert_unified_checkpoint(unified, tmp_path / "out", config=config, tp_size=1, pp_size=1)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_export_trtllm_checkpoint_calibrates_and_converts_moe_end_to_end(family: str, tmp_path: Path) -> None:
    """A saved tiny checkpoint (tests/support/family_models.py), FP8 weights and KV cache calibrated on a few random batches,
    TP 2: the quantize stage's whole path (load, mtq.quantize, unified export, conversion) on an MoE family."""
    from pipeline.quantization.modelopt_export import UNIFIED_SCRATCH_SUFFIX, QuantRecipe, export_trtllm_checkpoint
    from tests.support.family_models import FAMILY_CONFIGS, make_family_checkpoint

    hf_dir = make_family_checkpoint(family, tmp_path / "hf")
    hf = json.loads((hf_dir / "config.json").read_text())
    generator = torch.Generator().manual_seed(2)
    batches = [torch.randint(0, hf["vocab_size"], (2, 32), generator=generator) for _ in range(3)]
    out = tmp_path / "ckpt"
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        written = export_trtllm_checkpoint(
            hf_dir, out, dtype="float16", tp_size=2, pp_size=1, quant=QuantRecipe("fp8", "fp8"), forward_loop=lambda m: [m(b) for b in batches]
        )
    finally:
        torch.set_num_threads(previous)
    assert json.loads((out / "config.json").read_text()) == written
    experts = FAMILY_CONFIGS[family].get("num_local_experts") or FAMILY_CONFIGS[family].get("num_experts")
    inter = hf.get("moe_intermediate_size") or hf["intermediate_size"]
    assert written["moe"] == {"num_experts": experts, "top_k": hf["num_experts_per_tok"], "normalization_mode": 1 if family == "mixtral" else 0}
    assert written["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1, "moe_tp_size": 2, "moe_ep_size": 1}
    quantization = written["quantization"]
    assert (quantization["quant_algo"], quantization["kv_cache_quant_algo"]) == ("FP8", "FP8")
    assert {f"transformer.layers.{i}.mlp.router" for i in range(hf["num_hidden_layers"])} <= set(quantization["exclude_modules"])
    for rank in range(2):
        tensors = load_file(out / f"rank{rank}.safetensors")
        fc, router = tensors["transformer.layers.1.mlp.fc.weight"], tensors["transformer.layers.1.mlp.router.weight"]
        assert (fc.shape, fc.dtype) == ((experts, inter, hf["hidden_size"]), FP8)  # 2 * inter / tp rows
        assert (router.shape, router.dtype) == ((experts, hf["hidden_size"]), torch.float32)
        assert tensors["transformer.layers.1.mlp.fc.weights_scaling_factor"].shape == (experts, 1)
    assert not out.with_name(out.name + UNIFIED_SCRATCH_SUFFIX).exists()


@pytest.mark.parametrize(("family", "norm_topk_prob", "mode"), [("qwen3_moe", True, 1), ("qwen3_moe", False, 0), ("qwen2_moe", False, 0)])
def test_qwen_moe_routing_follows_norm_topk_prob(family: str, norm_topk_prob: bool, mode: int) -> None:
    """TensorRT-LLM's QWenConfig writes NONE for every Qwen MoE; transformers renormalises the top-k weights when
    norm_topk_prob is true (every released Qwen3-MoE), so the checkpoint says RENORMALIZE then."""
    architecture, extra = FAMILIES[family]
    hf = {
        "model_type": family,
        "architectures": [architecture],
        "num_attention_heads": 4,
        "hidden_size": HIDDEN,
        "num_hidden_layers": 2,
        "vocab_size": VOCAB,
        "num_experts_per_tok": TOP_K,
        "norm_topk_prob": norm_topk_prob,
        **extra,
    }
    config = pretrained_config(
        hf, dtype="float16", mapping={"world_size": 1, "tp_size": 1, "pp_size": 1}, quantization={"quant_algo": None, "kv_cache_quant_algo": None}
    )
    assert config["moe"] == {"num_experts": EXPERTS, "top_k": TOP_K, "normalization_mode": mode}
