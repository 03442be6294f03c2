"""Tiny random Qwen3, Granite, Phi-3, StarCoder2 and Nemotron models, exported to TensorRT-LLM checkpoints by the
project's converter.

Each model is made with transformers' own class (float32, eager attention, non-trivial norms), saved as
safetensors, and exported with `pipeline.quantization.modelopt_export.export_trtllm_checkpoint` (ModelOpt's
unified checkpoint, then `trtllm_convert`: what the quantize stage writes for build.target cpu, whose checkpoint
config it passes) in float16, unquantized and, on request, quantized (fp8, int4_awq, int8_sq, int8_wo, w4a8_awq;
fp8 / int8_sq with an FP8 / INT8 KV cache), keeping ModelOpt's calibrated fake-quant model of each. The transformers
reference is the saved float32 model with its parameters round-tripped through float16, the values the checkpoint
holds (as conftest.py does); Nemotron's LayerNorm1P weights w are stored as fp16(w + 1), so its reference holds
fp16(w + 1) - 1.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

VOCAB_SIZE = 256
_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "initializer_range": 0.08,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
LONG_ROPE_ORIGINAL = 64  # original_max_position_embeddings of the long-RoPE model: prompts cross it
# name -> (model_type, config overrides)
FAMILY_SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    # head_dim 32 while hidden / heads is 16
    "qwen3": ("qwen3", {"head_dim": 32}),
    # Granite 3's multipliers, none of them 1 (attention_multiplier is not 1 / sqrt(head_dim) = 0.25)
    "granite": ("granite", {"embedding_multiplier": 12.0, "attention_multiplier": 0.05, "residual_multiplier": 0.22, "logits_scaling": 8.0}),
    # Phi-3-mini-4k style: fused qkv / gate_up, full rotary, no scaling
    "phi3": ("phi3", {"sliding_window": None}),
    # Phi-4-mini / Phi-3.5 128k style: partial rotary 0.75 and long-RoPE (the converter writes long_rope from 128000)
    "phi3_longrope": (
        "phi3",
        {
            "sliding_window": None,
            "max_position_embeddings": 131072,
            "original_max_position_embeddings": LONG_ROPE_ORIGINAL,
            "partial_rotary_factor": 0.75,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.75,
                "short_factor": [1.0, 1.05, 1.1, 1.3, 1.6, 2.0],
                "long_factor": [1.2, 1.8, 3.0, 6.0, 12.0, 24.0],
            },
        },
    ),
    # TensorRT-LLM's GPT class: LayerNorm with bias, biased attention and MLP, GELU (tanh), no sliding window
    "starcoder2": ("starcoder2", {"sliding_window": None, "norm_epsilon": 1e-5}),
    # LayerNorm1P (stored as weight + 1), squared-ReLU MLP without bias, partial rotary 0.5
    "nemotron": ("nemotron", {"partial_rotary_factor": 0.5, "norm_eps": 1e-5}),
}

# Formats with a quantized KV cache: name -> (quantize.algo, quantize.kv_cache)
KV_CACHE_FORMATS = {"fp8_kv_fp8": ("fp8", "fp8"), "int8_sq_kv_int8": ("int8_sq", "int8")}
# Mixture-of-experts families (test_refengine_moe.py): Mixtral renormalises its top-k routing weights, Qwen2-MoE does not
# (norm_topk_prob false, as Qwen1.5-MoE) and has a shared expert, Qwen3-MoE renormalises (norm_topk_prob true, as every
# released Qwen3-MoE). Routers are scaled up (ROUTER_SCALE) so that routing is decisive, not a near-tie of 1e-7.
MOE_SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None}),
    "qwen2_moe": (
        "qwen2_moe",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 128, "norm_topk_prob": False},
    ),
    "qwen3_moe": ("qwen3_moe", {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "head_dim": 32, "norm_topk_prob": True}),
}
ROUTER_SCALE = 8.0
# Each model's weight seed, fixed per name: adding a model leaves the others' weights (and measured numbers) unchanged.
SEEDS = {"granite": 0, "phi3": 1, "phi3_longrope": 2, "qwen3": 3, "starcoder2": 4, "nemotron": 5, "mixtral": 0, "qwen2_moe": 1, "qwen3_moe": 2}


@dataclass
class FamilyModel:
    name: str
    hf_dir: Path
    hf_model: Any  # transformers, float32 with the checkpoint's fp16 values, EOS disabled
    checkpoints: dict[str, Path] = field(default_factory=dict)  # format -> TensorRT-LLM checkpoint
    # format -> ModelOpt's calibrated fake-quant model as the export received it, and as its pre-export step (averaged,
    # folded pre-quant scales; shared amax) left it; float32 (quant_fixtures._capture_models)
    fake_quant: dict[str, Any] = field(default_factory=dict)
    fake_quant_exported: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def _save_hf(model_type: str, overrides: dict[str, Any], directory: Path, seed: int) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**_COMMON, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    model.config.architectures = [type(model).__name__]
    with torch.no_grad():  # non-trivial norms (q/k norms and LayerNorm biases included), so a mapping mistake shows
        for name, parameter in model.named_parameters():
            if name.endswith(("norm.weight", "norm.bias")):
                parameter.add_(0.2 * torch.randn_like(parameter))
            if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):  # MoE routers
                parameter.mul_(ROUTER_SCALE)
    model.save_pretrained(directory)


def _reference(hf_dir: Path, moe: bool = False) -> Any:
    from transformers import AutoModelForCausalLM

    from pipeline.quantization.trtllm_checkpoint.layout import layout_for

    # MoE: transformers' own per-expert loop (experts_implementation "eager"), not its default grouped_mm
    extra = {"experts_implementation": "eager"} if moe else {}
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager", **extra).eval()
    plus_one = layout_for(model.config.model_type).norm_plus_one
    with torch.no_grad():  # the exported fp16 values; buffers (RoPE inv_freq) stay float32
        for name, parameter in model.named_parameters():
            value = parameter.half().float()
            if plus_one and name.endswith("norm.weight"):  # the checkpoint holds fp16(w + 1)
                value = (value + 1).half().float() - 1
            parameter.copy_(value)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def build_family_model(
    name: str,
    root: Path,
    formats: tuple[str, ...] = ("fp16",),
    specs: dict[str, tuple[str, dict[str, Any]]] = FAMILY_SPECS,
) -> FamilyModel:
    """The model `name` of `specs` (FAMILY_SPECS or MOE_SPECS) with its checkpoint in each format (fp16 or a
    quantize.algo value)."""
    from pipeline.quant_formats import recipe_quantization
    from pipeline.quantization.modelopt_export import QuantRecipe, export_trtllm_checkpoint
    from pipeline.quantization.trtllm_checkpoint.pretrained import checkpoint_mapping, pretrained_config
    from tests.support.quant_fixtures import _capture_models

    model_type, overrides = specs[name]
    hf_dir = root / name / "hf"
    _save_hf(model_type, overrides, hf_dir, seed=SEEDS[name])
    family = FamilyModel(name, hf_dir, _reference(hf_dir, moe=specs is MOE_SPECS))
    generator = torch.Generator().manual_seed(7)
    calibration = [torch.randint(0, VOCAB_SIZE, (2, 32), generator=generator) for _ in range(2)]

    def forward_loop(model: Any) -> None:
        for batch in calibration:
            model(batch.to(next(model.parameters()).device))

    hf_config = json.loads((hf_dir / "config.json").read_text())
    for fmt in formats:
        start = time.perf_counter()
        algo, kv_cache = KV_CACHE_FORMATS.get(fmt, ("none" if fmt == "fp16" else fmt, "none"))
        recipe = QuantRecipe(algo, kv_cache, group_size=32)
        # The checkpoint config the quantize stage passes for build.target cpu (the family table's cpu cells: StarCoder2
        # takes formats there that trtllm-build does not, which the export's own default would refuse).
        config = pretrained_config(hf_config, dtype="float16", mapping=checkpoint_mapping(1, 1), quantization=recipe_quantization(recipe.algo, recipe.kv_cache))
        captured: dict[str, Any] = {}
        with _capture_models(captured):
            export_trtllm_checkpoint(
                hf_dir,
                root / name / fmt,
                dtype="float16",
                tp_size=1,
                pp_size=1,
                quant=recipe,
                forward_loop=None if fmt == "fp16" else forward_loop,
                checkpoint_config=config,
            )
        if fmt not in ("fp16", "int8_wo"):  # int8_wo is exported unquantized (the engine quantizes at load)
            family.fake_quant[fmt] = captured["before"].float().eval()
            family.fake_quant_exported[fmt] = captured["after"].float().eval()
        family.checkpoints[fmt] = root / name / fmt
        family.seconds[fmt] = time.perf_counter() - start
    return family


def family_engine(checkpoint_dir: Path, **changes: Any) -> Any:
    """refengine on a family checkpoint, small paged cache (8-token blocks), with EngineConfig `changes`."""
    from refengine import EngineConfig, LLMEngine

    values = dict(tokens_per_block=8, max_num_tokens=256, max_batch_size=8)
    values.update(changes)
    return LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(**values))


def random_prompts(name: str, lengths: tuple[int, ...] = (1, 9, 23, 41, 70)) -> list[list[int]]:
    """Prompts of these lengths, random token ids above the special ones, seeded by the model's name."""
    rng = random.Random(len(name))
    return [[rng.randrange(3, VOCAB_SIZE) for _ in range(length)] for length in lengths]


def assert_engine_mechanisms(family: FamilyModel, base: list[int], max_new_tokens: int) -> None:
    """Paged KV with prefix reuse, chunked prefill (8-token chunks), inflight batching and a beam request beside the
    greedy ones, on `family`'s fp16 checkpoint: the greedy outputs are still transformers' own, and the beam request
    equals running alone. `base` is the longest prompt; two more share its prefixes."""
    from refengine import SamplingParams
    from tests.refengine.conftest import hf_greedy

    engine = family_engine(
        family.checkpoints["fp16"], tokens_per_block=4, max_num_tokens=8, enable_chunked_context=True, enable_prefix_caching=True, max_beam_width=2
    )
    prompts = [base, base[:-3] + [5, 6, 7], base[:17] + [9]]  # shared prefixes: the later ones reuse cached blocks
    greedy = SamplingParams(max_tokens=max_new_tokens, temperature=0)
    beam = SamplingParams(max_tokens=8, beam_width=2, n=2, temperature=0)
    [first] = engine.generate([prompts[0]], greedy)
    outputs = engine.generate(prompts[1:] + [prompts[0][:12]], [greedy, greedy, beam])
    assert engine.stats().num_prefix_cache_hits >= 2
    for prompt, output in zip(prompts, [first, *outputs[:2]]):
        assert output.outputs[0].token_ids == hf_greedy(family.hf_model, prompt, max_new_tokens), f"prompt {len(prompt)}"
    [alone] = family_engine(family.checkpoints["fp16"], max_beam_width=2).generate([prompts[0][:12]], beam)
    assert [c.token_ids for c in outputs[2].outputs] == [c.token_ids for c in alone.outputs]
