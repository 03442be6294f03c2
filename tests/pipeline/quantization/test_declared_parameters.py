"""The converter's TensorRT-LLM checkpoints against an independent oracle: what TensorRT-LLM 1.2's model classes declare.

For every family the engine target builds (pipeline/config/families.py), a tiny random model is exported (unquantized
and FP8 + FP8 KV, ModelOpt's unified export) and converted at TP 1 and 2 (TP 4 too: the models have 2 KV heads, so
each rank repeats one). Per rank, the names, shapes and dtypes written must EQUAL, both ways, what the NVIDIA class
declares for the written config.json (tests/support/trtllm_declared.py, restated from NVIDIA's source, never from
the converter): an extra tensor fails here although NVIDIA's `PretrainedModel.load` only logs it. The written
`hidden_act` must be what NVIDIA's `<Family>Config.from_hugging_face` writes for the same Hugging Face config.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from pipeline.config.families import FAMILIES
from tests.support.family_models import FAMILY_CONFIGS
from tests.support.trtllm_declared import as_loaded, compare, declared_parameters, expected_hidden_act
from tests.support.unified_exports import cached_exports, convert, quantize_and_export

VOCAB = 498  # not a multiple of 4: TP 4 pads the lm_head and the last embedding shard
ENGINE_FAMILIES = [family.name for family in FAMILIES if family.trtllm_class is not None]
_SMALL = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": VOCAB,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


class Differs(AssertionError):
    """The checkpoint is not what NVIDIA's class declares."""


LAYOUT_CASES = [
    pytest.param(family, algo, tp, id=f"{family}-{algo}-tp{tp}")
    for family in ENGINE_FAMILIES
    for algo in ("none", "fp8")
    for tp in (1, 2, 4)
    if tp != 4 or algo == "fp8"  # TP 4 (KV heads < TP) once per family, with the scales
] + [
    # tied embeddings: the converter may leave lm_head out (load's sharing exemption) or write it
    pytest.param(family, f"{algo}-tied", tp, id=f"{family}-{algo}-tied-tp{tp}")
    for family in ("llama", "qwen2", "gemma", "starcoder2")
    for algo in ("none", "fp8")
    for tp in (1, 2)
]


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory):
    with cached_exports(tmp_path_factory.mktemp("declared"), _export) as get:
        yield get


@pytest.fixture(scope="module")
def converted(exports, tmp_path_factory: pytest.TempPathFactory):
    root, made = tmp_path_factory.mktemp("declared-tp"), {}

    def get(family: str, algo: str, tp: int) -> Path:
        if (family, algo, tp) not in made:
            out = root / f"{family}-{algo}-tp{tp}"
            convert(exports(family, algo), out, tp)
            made[family, algo, tp] = out
        return made[family, algo, tp]

    return get


def _export(family: str, variant: str, directory: Path) -> Path:
    """`variant` is the quantize.algo (none, fp8 with FP8 KV), `-tied` for tied input/output embeddings."""
    from transformers import AutoConfig, AutoModelForCausalLM

    algo, _, tied = variant.partition("-")
    torch.manual_seed(0)
    settings = {**_SMALL, **FAMILY_CONFIGS[family], "tie_word_embeddings": tied == "tied"}
    settings.setdefault("intermediate_size", 256)
    config = AutoConfig.for_model(family, max_position_embeddings=256, **settings)
    model = AutoModelForCausalLM.from_config(config).to(torch.float16).eval()
    model.config.architectures = [type(model).__name__]
    return quantize_and_export(model, algo, VOCAB, directory)


def _written(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    with safe_open(str(path), framework="pt") as tensors:
        return {name: (tuple(tensors.get_slice(name).get_shape()), str(tensors.get_tensor(name).dtype).removeprefix("torch.")) for name in tensors.keys()}


@pytest.mark.parametrize(("family", "algo", "tp"), LAYOUT_CASES)
def test_written_tensors_equal_what_the_tensorrt_llm_class_declares(family: str, algo: str, tp: int, converted) -> None:
    out = converted(family, algo, tp)
    config = json.loads((out / "config.json").read_text())
    report = {}
    for rank in range(tp):
        declared = declared_parameters(config, rank)
        written = _written(out / f"rank{rank}.safetensors")
        differences = compare(declared, as_loaded(written, (config.get("quantization") or {}).get("quant_algo")))
        if any(differences.values()):
            report[f"rank{rank}"] = differences
        print(f"{family}-{algo}-tp{tp} rank{rank}: {len(declared)} declared, {sum(map(len, differences.values()))} differences")
    if report:
        raise Differs(f"{config['architecture']} checkpoint differs from what TensorRT-LLM 1.2 declares: {json.dumps(report, indent=1)}")


@pytest.mark.parametrize("family", ENGINE_FAMILIES)
def test_hidden_act_is_what_nvidias_config_writes(family: str, exports, converted) -> None:
    hf = json.loads((exports(family, "none") / "config.json").read_text())
    written = json.loads((converted(family, "none", 1) / "config.json").read_text())
    if written["hidden_act"] != expected_hidden_act(hf):
        raise Differs(f"{family}: hidden_act {written['hidden_act']!r} written, NVIDIA's config writes {expected_hidden_act(hf)!r}")


def test_the_oracle_reports_an_extra_a_missing_and_a_reshaped_tensor(converted) -> None:
    """The comparison itself: what NVIDIA's loader would only log (an extra tensor) is an error here."""
    out = converted("llama", "none", 2)
    config = json.loads((out / "config.json").read_text())
    written = _written(out / "rank1.safetensors")
    qkv = "transformer.layers.0.attention.qkv.weight"
    # by hand: 4 heads of 32 over TP 2 -> 2 query heads, 2 KV heads -> 1 each: (2 + 2 * 1) * 32 rows of hidden 128
    assert declared_parameters(config, 1)[qkv] == ((128, 128), "float16")
    written["transformer.layers.0.mlp.up.weight"] = ((128, 128), "float16")
    written[qkv] = ((96, 128), "float16")
    del written["transformer.ln_f.weight"]
    assert compare(declared_parameters(config, 1), as_loaded(written)) == {
        "missing": ["transformer.ln_f.weight"],
        "extra": ["transformer.layers.0.mlp.up.weight"],
        "mismatched": [f"{qkv}: written ((96, 128), 'float16'), declared ((128, 128), 'float16')"],
    }


def test_kv_heads_repeat_when_tp_exceeds_them() -> None:
    config = {
        "architecture": "LlamaForCausalLM",
        "dtype": "bfloat16",
        "vocab_size": 498,
        "hidden_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_size": 32,
        "intermediate_size": 256,
        "hidden_act": "silu",
        "use_parallel_embedding": True,
        "mapping": {"world_size": 4, "tp_size": 4, "pp_size": 1},
        "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
    }
    declared = declared_parameters(config, 3)
    assert declared["transformer.layers.0.attention.qkv.weight"] == ((96, 128), "float8_e4m3fn")  # (1 + 2 * 1) * 32
    assert declared["transformer.vocab_embedding.weight"] == ((125, 128), "bfloat16")  # ceil(498 / 4)
    assert declared["lm_head.weight"] == ((125, 128), "bfloat16")  # pad_vocab_size(498, 4) / 4, not quantized
    assert declared["transformer.layers.0.mlp.gate.weight"] == ((64, 128), "float8_e4m3fn")
    assert "lm_head.weights_scaling_factor" not in declared


def test_k_and_v_cache_scales_load_as_one_kv_scale_and_its_reciprocal() -> None:
    written = {"a.attention.k_cache_scaling_factor": ((1,), "float32"), "a.attention.v_cache_scaling_factor": ((1,), "float32")}
    assert as_loaded(written) == {"a.attention.kv_cache_scaling_factor": ((1,), "float32"), "a.attention.kv_cache_rcp_scaling_factor": ((1,), "float32")}
    with pytest.raises(ValueError, match="v_cache_scaling_factor"):
        as_loaded({"a.attention.k_cache_scaling_factor": ((1,), "float32")})
