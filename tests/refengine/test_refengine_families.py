"""Qwen3, Granite, Phi-3/4, StarCoder2 and Nemotron (refengine/architectures.py rows) from the checkpoints the quantize
stage writes.

Tiny random transformers models of each family (tests/support/family_fixtures.py) are exported through the
project's converter and run by the engine: greedy output equals transformers' `generate` token for token
(unquantized, 32 tokens, several prompts); every cpu weight format (FP8, INT4 AWQ, INT8 SmoothQuant, INT8
weight-only, W4A8 AWQ) of every family loads, matches ModelOpt's own calibrated fake-quant model and agrees with the
unquantized run (thresholds below), as do Qwen3's FP8 and INT8 KV caches, whose paged tensors hold codes; every engine
mechanism (paged KV with prefix reuse, chunked prefill, inflight batching, beams) runs each family unchanged; long-RoPE
switches tables by prompt length; options refengine does not implement are refused by name.
"""

from __future__ import annotations

import json
import random
import shutil
import time

import pytest
import torch

from refengine import ModelLoadError, SamplingParams, load_checkpoint
from refengine.model_runner import load_model
from tests.refengine.conftest import hf_greedy
from tests.support.family_fixtures import (
    FAMILY_SPECS,
    LONG_ROPE_ORIGINAL,
    VOCAB_SIZE,
    assert_engine_mechanisms,
    build_family_model,
    family_engine,
    random_prompts,
)
from tests.support.quant_fixtures import paged_prefill

MAX_NEW_TOKENS = 32
QUANTIZED = ("fp8", "int4_awq", "int8_sq", "int8_wo", "w4a8_awq")
# Against the unquantized checkpoint on a [2, 48] teacher-forced batch (96 positions): top-1 agreement and the
# minimum per-position cosine of the logits. These random tiny models have flat distributions (logit std ~0.65 over
# 256 tokens), so near-ties flip often; a Llama of the same shape through the same path measures fp8 0.82 / 0.975,
# int4_awq 0.69 / 0.933. Measured here: fp8 0.77-0.99 / 0.939-0.9999, int4_awq 0.53-0.96 / 0.784-0.9997 (Granite
# highest: its residual multiplier keeps the logits near the embedding's; Nemotron lowest, 0.573 / 0.784).
# int8_wo measures 0.958-1.0 / 0.9991-1.0. int8_sq measures 0.58-0.97 / 0.674-0.998 and w4a8_awq 0.44-0.97 /
# 0.79-0.9996: Phi-3's int8_sq min cosine of 0.674 and long-RoPE Phi-3's w4a8_awq top-1 of 0.44 are ModelOpt's own
# quantization of these tiny models, not the converter's or the engine's: ModelOpt's fake-quant model measures the same
# against the unquantized one (0.673; 0.47), and the engine agrees with it (test_quantized_checkpoints_match_modelopt).
MIN_AGREEMENT = {
    "fp8": (0.72, 0.92),
    "int4_awq": (0.5, 0.75),
    "int8_wo": (0.95, 0.999),
    "int8_sq": (0.55, 0.65),
    "w4a8_awq": (0.4, 0.75),
    "fp8_kv_fp8": (0.72, 0.92),
    "int8_sq_kv_int8": (0.55, 0.65),  # Qwen3 measures 0.79 / 0.973 and 0.79 / 0.895
}
# Against ModelOpt's calibrated fake-quant model as its unified export prepares it (AWQ / SmoothQuant pre-quant scales
# averaged over q/k/v and folded into the norm), on the same batch: minimum per-position cosine. Measured: int4_awq
# 0.9990-1.0, int8_sq 0.9964-1.0 (with INT8 KV 0.998), fp8 0.982-0.99995 (with FP8 KV 0.984), w4a8_awq 0.986-0.99999.
# FP8 and W4A8 are looser because ModelOpt's export computes the fp8 weight codes in float16 (w / s rounded to fp16,
# then to fp8: ties such as 100.02 -> 100.0 -> 96 where the fake-quant model's float32 rounds to 104; 16 of Phi-3's
# 4096 o_proj codes), so the checkpoint's weights are not exactly the fake-quant model's, and the converter shares the
# max FP8 scale over q/k/v (the fake-quant model keeps three). Against the fake-quant model before that preparation
# AWQ on separate q/k/v measures 0.76-0.96 (the export changes the model); Phi-3's fused qkv_proj / gate_up_proj are
# one Linear each there, so nothing is averaged: 0.9996-0.9999.
MIN_COSINE_VS_FAKE_QUANT = {
    "fp8": 0.975,
    "int4_awq": 0.998,
    "int8_sq": 0.995,
    "w4a8_awq": 0.98,
    "fp8_kv_fp8": 0.975,
    "int8_sq_kv_int8": 0.995,
}
KV_CACHE_FAMILY = "qwen3"  # also exported with an FP8 / INT8 KV cache
KV_CACHE = {"fp8_kv_fp8": torch.float8_e4m3fn, "int8_sq_kv_int8": torch.int8}
QUANT_ALGOS = {"fp8": "FP8", "int4_awq": "W4A16_AWQ", "int8_sq": "W8A8_SQ_PER_CHANNEL", "int8_wo": "W8A16", "w4a8_awq": "W4A8_AWQ"}
QUANTIZED_CASES = [(name, fmt) for name in sorted(FAMILY_SPECS) for fmt in QUANTIZED] + [(KV_CACHE_FAMILY, f) for f in KV_CACHE]


def _build_families(root, quantized: bool) -> dict:
    built = {}
    for name in FAMILY_SPECS:
        start = time.perf_counter()
        formats = ("fp16", *QUANTIZED, *(KV_CACHE if name == KV_CACHE_FAMILY else ())) if quantized else ("fp16",)
        built[name] = build_family_model(name, root, formats=formats)
        print(f"{name}: built in {time.perf_counter() - start:.1f} s ({built[name].seconds})")
    return built


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """Each family's fp16 checkpoint (a second or two for all of them)."""
    return _build_families(tmp_path_factory.mktemp("families"), quantized=False)


@pytest.fixture(scope="module")
def quantized_families(tmp_path_factory):
    """The same seeded models (the same weights) with every quantized checkpoint too: a ModelOpt calibration per
    family and format, the slow part of this module, so only the tests marked slow ask for it."""
    return _build_families(tmp_path_factory.mktemp("quantized_families"), quantized=True)


def _prompts(name: str) -> list[list[int]]:
    """Several lengths; for long-RoPE, prompts that stay at or below original_max_position_embeddings with their 32
    tokens and prompts longer than it (transformers recomputes its cache where a sequence crosses it mid-generation,
    TensorRT-LLM keeps the prompt's table: see test_long_rope_table_follows_the_prompt_length)."""
    return random_prompts(name, (1, 9, 23, 30, 65, 70, 100) if name == "phi3_longrope" else (1, 9, 23, 41, 70))


@pytest.mark.parametrize("name", sorted(FAMILY_SPECS))
def test_greedy_matches_transformers(families, name):
    family = families[name]
    prompts = _prompts(name)
    outputs = family_engine(family.checkpoints["fp16"]).generate(prompts, SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0))
    for prompt, output in zip(prompts, outputs):
        expected = hf_greedy(family.hf_model, prompt, MAX_NEW_TOKENS)
        assert output.outputs[0].token_ids == expected, f"{name}, prompt of length {len(prompt)}"


def _batch() -> torch.Tensor:
    """The fixed teacher-forced [2, 48] batch every format is compared on (not the calibration data)."""
    return torch.randint(3, VOCAB_SIZE, (2, 48), generator=torch.Generator().manual_seed(3))


def _engine_logits(checkpoint_dir, tokens: torch.Tensor) -> torch.Tensor:
    """[positions, VOCAB_SIZE] after one paged prefill (AWQ pads the vocabulary to a multiple of 64: cut off)."""
    logits, _ = paged_prefill(load_model(load_checkpoint(checkpoint_dir)), tokens.tolist())
    return torch.cat(logits)[:, :VOCAB_SIZE]


def _compare(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """Top-1 agreement and the minimum per-position cosine of two [positions, vocab] logits."""
    agreement = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    return agreement, torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1).min().item()


@pytest.mark.slow
@pytest.mark.parametrize(("name", "fmt"), QUANTIZED_CASES)
def test_quantized_checkpoints_load_and_agree(quantized_families, name, fmt):
    family = quantized_families[name]
    config = json.loads((family.checkpoints[fmt] / "config.json").read_text())
    assert config["quantization"]["quant_algo"] == QUANT_ALGOS[fmt.removesuffix("_kv_fp8").removesuffix("_kv_int8")]
    reference = _engine_logits(family.checkpoints["fp16"], _batch())
    quantized = _engine_logits(family.checkpoints[fmt], _batch())
    agreement, cosine = _compare(reference, quantized)
    print(f"{name} {fmt}: top-1 agreement {agreement:.3f} over {reference.shape[0]} positions, min cosine {cosine:.4f}")
    assert bool(torch.isfinite(quantized).all())
    min_agreement, min_cosine = MIN_AGREEMENT[fmt]
    assert agreement >= min_agreement and cosine >= min_cosine


@pytest.mark.slow
@pytest.mark.parametrize(("name", "fmt"), [(n, f) for n, f in QUANTIZED_CASES if f != "int8_wo"])
def test_quantized_checkpoints_match_modelopt_fake_quant(quantized_families, name, fmt):
    """The engine runs each converted checkpoint as ModelOpt's own fake-quant model computes it, so what a format loses
    against the unquantized model is the format's (the fake-quant model loses the same), not the converter's (which
    splits Phi-3's fused qkv_proj / gate_up_proj) or the engine's."""
    family, tokens = quantized_families[name], _batch()
    engine = _engine_logits(family.checkpoints[fmt], tokens)
    with torch.no_grad():
        fake_quant = family.fake_quant_exported[fmt](tokens).logits.reshape(-1, VOCAB_SIZE).float()
        before_export = family.fake_quant[fmt](tokens).logits.reshape(-1, VOCAB_SIZE).float()
        unquantized = family.hf_model(tokens).logits.reshape(-1, VOCAB_SIZE)
    agreement, cosine = _compare(engine, fake_quant)
    print(
        f"{name} {fmt}: vs fake-quant top-1 {agreement:.3f} min cosine {cosine:.5f}; vs it before export "
        "{:.3f} / {:.4f}; engine vs unquantized {:.3f} / {:.4f}, fake-quant vs unquantized {:.3f} / {:.4f}".format(
            *_compare(engine, before_export), *_compare(engine, unquantized), *_compare(fake_quant, unquantized)
        )
    )
    assert cosine >= MIN_COSINE_VS_FAKE_QUANT[fmt]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", sorted(KV_CACHE))
def test_quantized_kv_cache_holds_codes_and_decodes_as_a_recompute(quantized_families, fmt):
    """Qwen3 with an FP8 / INT8 KV cache: the paged KV tensors hold codes, and greedy decode through the quantized cache
    gives the tokens a full recompute of prompt + output picks."""
    family = quantized_families[KV_CACHE_FAMILY]
    model = load_model(load_checkpoint(family.checkpoints[fmt]))
    _, runner = paged_prefill(model, _batch().tolist())
    assert model.kv_cache_layout.dtype == KV_CACHE[fmt]
    assert all(kv.dtype == KV_CACHE[fmt] and kv.to(torch.float32).abs().sum() > 0 for kv in runner.kv_caches)
    assert all(layer.kv_quant is not None for layer in model.layers)
    prompts = [_batch()[0, :13].tolist(), _batch()[1, :30].tolist()]
    outputs = family_engine(family.checkpoints[fmt]).generate(prompts, SamplingParams(max_tokens=8, temperature=0))
    for prompt, output in zip(prompts, outputs):
        tokens = list(output.outputs[0].token_ids)
        [logits], _ = paged_prefill(model, [prompt + tokens[:-1]])
        assert logits[len(prompt) - 1 :].argmax(dim=-1).tolist() == tokens


@pytest.mark.parametrize("name", sorted(FAMILY_SPECS))
def test_every_engine_mechanism_runs_the_family(families, name):
    """Paged KV with prefix reuse, chunked prefill (8-token chunks), inflight batching and a beam request beside the
    greedy ones: the greedy outputs are still transformers' own, and the beam request equals running alone."""
    # the last prompt is longer than original_max_position_embeddings for long-RoPE
    assert_engine_mechanisms(families[name], _prompts(name)[-1], MAX_NEW_TOKENS)


def test_long_rope_table_follows_the_prompt_length(families, tmp_path):
    """A prompt within original_max_position_embeddings keeps the short factors for its whole life, also once its
    generation crosses that length (TensorRT-LLM's rule: the plugin picks the table by the context length;
    transformers instead drops its cache there and recomputes everything with the long factors). Checked against
    the same checkpoint whose long factors are the short ones; a long prompt does use the long factors."""
    family = families["phi3_longrope"]
    short_only = tmp_path / "short_only"
    shutil.copytree(family.checkpoints["fp16"], short_only)
    config = json.loads((short_only / "config.json").read_text())
    config["longrope_scaling_long_factors"] = config["longrope_scaling_short_factors"]
    (short_only / "config.json").write_text(json.dumps(config))
    rng = random.Random(5)
    crossing = [rng.randrange(3, VOCAB_SIZE) for _ in range(LONG_ROPE_ORIGINAL - 10)]
    long_prompt = [rng.randrange(3, VOCAB_SIZE) for _ in range(LONG_ROPE_ORIGINAL + 20)]
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0, logprobs=1)
    got = family_engine(family.checkpoints["fp16"], enable_prefix_caching=True).generate([crossing, long_prompt], params)
    reference = family_engine(short_only).generate([crossing, long_prompt], params)
    assert got[0].outputs[0].token_ids == reference[0].outputs[0].token_ids
    assert [s.logprob for s in got[0].outputs[0].logprobs] == [s.logprob for s in reference[0].outputs[0].logprobs]
    assert [s.logprob for s in got[1].outputs[0].logprobs] != [s.logprob for s in reference[1].outputs[0].logprobs]


# A StarCoder2 checkpoint config as the converter writes it (the writer's Llama tensors are not read: refused first).
GPT = {
    "architecture": "Starcoder2ForCausalLM",
    "gpt_variant": "starcoder2",
    "hidden_act": "gelu",
    "rmsnorm": False,
    "bias": True,
    "position_embedding_type": "rope_gpt_neox",
    "q_scaling": 1.0,
    "apply_query_key_layer_scaling": False,
    "inner_layernorm": False,
}


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        (
            {"architecture": "Phi3SmallForCausalLM", "blocksparse_block_size": 64, "blocksparse_vertical_stride": 8},
            "blocksparse_block_size is set: block-sparse attention (Phi-3-small)",
        ),
        ({"architecture": "Phi3SmallForCausalLM", "gegelu_limit": 20.0}, "gegelu_limit is set"),
        ({"architecture": "PhiMoEForCausalLM", "moe": {"num_experts": 16, "top_k": 2}}, "moe.num_experts > 0"),
        (
            {
                "architecture": "Phi3ForCausalLM",
                "position_embedding_type": "long_rope",
                "original_max_position_embeddings": 64,
                "longrope_scaling_short_factors": [1.0] * 4,
                "longrope_scaling_long_factors": [2.0] * 4,
                "rotary_scaling": {"type": "longrope", "attention_factor": 1.3},
            },
            "rotary_scaling.attention_factor",
        ),
        ({"architecture": "Phi3ForCausalLM", "position_embedding_type": "long_rope"}, "original_max_position_embeddings"),
        ({"architecture": "Phi3ForCausalLM", "position_embedding_type": "alibi"}, "position_embedding_type 'alibi'"),
        ({"architecture": "Qwen3ForCausalLM", "qwen_type": "qwen3", "qk_layernorm": False}, "qk_layernorm must be true"),
        ({"architecture": "Qwen3ForCausalLM", "qwen_type": "qwen3_moe", "qk_layernorm": True}, "qwen_type 'qwen3_moe'"),
        ({"architecture": "LlamaForCausalLM", "embedding_multiplier": 12.0}, "embedding_multiplier 12.0 is not supported"),
        ({"architecture": "LlamaForCausalLM", "rotary_pct": 0.5}, "rotary_pct 0.5 is not supported"),
        ({"architecture": "GraniteForCausalLM", "residual_multiplier": -1}, "residual_multiplier must be a positive"),
        *[
            ({**GPT, **changes}, named)
            for changes, named in [
                ({"gpt_variant": None}, "gpt_variant is missing: TensorRT-LLM's GPT class then runs GPT-2"),
                ({"gpt_variant": "persimmon"}, "gpt_variant 'persimmon' is not supported (supported: starcoder2, nemotron)"),
                ({"architecture": "GPTForCausalLM", "gpt_variant": "gpt2"}, "gpt_variant 'gpt2' is not supported"),
                ({"position_embedding_type": "learned_absolute"}, "position_embedding_type 'learned_absolute' is not supported"),
                ({"hidden_act": "silu"}, "hidden_act 'silu' is not supported by the GPT class here (supported: gelu, squared-relu)"),
                ({"hidden_act": "geglu"}, "hidden_act 'geglu' is not supported by the GPT class"),
                ({"rmsnorm": True}, "rmsnorm is true; the GPT class here runs LayerNorm"),
                ({"q_scaling": 0.5}, "q_scaling 0.5 is not supported by the GPT class here"),
                ({"apply_query_key_layer_scaling": True}, "apply_query_key_layer_scaling True is not supported"),
                ({"inner_layernorm": True}, "inner_layernorm True is not supported"),
                ({"qk_layernorm": True}, "qk_layernorm True is not supported"),
                ({"embedding_scale": 2.0}, "embedding_scale 2.0 is not supported"),
                ({"moe": {"num_experts": 4, "top_k": 2}}, "moe.num_experts > 0"),
                ({"rotary_pct": 0.0}, "rotary_pct 0.0 must be a number in (0, 1]"),
            ]
        ],
        ({"architecture": "LlamaForCausalLM", "hidden_act": "gelu"}, "hidden_act 'gelu' is not supported (supported: silu)"),
    ],
)
def test_options_refengine_does_not_implement_are_refused_by_name(checkpoint_writer, tmp_path, changes, named):
    directory = checkpoint_writer(tmp_path / "ckpt", **changes)
    with pytest.raises(ModelLoadError, match=named.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        load_checkpoint(directory)


def test_long_rope_factors_must_cover_the_rotary_dimension(checkpoint_writer, tmp_path):
    directory = checkpoint_writer(
        tmp_path / "ckpt",
        architecture="Phi3ForCausalLM",
        position_embedding_type="long_rope",
        rotary_pct=0.5,
        original_max_position_embeddings=64,
        longrope_scaling_short_factors=[1.0] * 4,
        longrope_scaling_long_factors=[2.0] * 4,
    )
    with pytest.raises(ModelLoadError, match="longrope_scaling_short_factors has 4 factors; rotary dimension 4 needs 2"):
        load_model(load_checkpoint(directory))


def test_gpt_bias_true_requires_every_linear_bias(families, tmp_path):
    """StarCoder2's checkpoint says `bias: true`: a decoder Linear without its bias is refused by name, not run bare."""
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "no_fc_bias"
    shutil.copytree(families["starcoder2"].checkpoints["fp16"], broken)
    tensors = load_file(str(broken / "rank0.safetensors"))
    del tensors["transformer.layers.1.mlp.fc.bias"]
    save_file(tensors, str(broken / "rank0.safetensors"))
    with pytest.raises(ModelLoadError, match=r"tensor 'transformer\.layers\.1\.mlp\.fc\.bias' \(expected shape \(128,\)\) is missing"):
        load_model(load_checkpoint(broken))


def test_phi3_runs_the_mlp_its_checkpoint_names_as_tensorrt_llm_would(families, tmp_path):
    """refengine computes Phi-3's plain MLP from `hidden_act`, as TensorRT-LLM's Phi3 class does (proj(act(fc(x))), no
    mlp.gate): the converter's checkpoint (swiglu over fc rows [up; gate]) equals transformers, and a checkpoint in a
    gated layout with `hidden_act: silu` (what this converter wrote before: fc = the gate half, an extra mlp.gate = the
    up half) computes proj(silu(gate x)), which an engine built from it would, and differs from transformers."""
    from safetensors.torch import load_file, save_file

    family = families["phi3"]
    fixed = family.checkpoints["fp16"]
    assert json.loads((fixed / "config.json").read_text())["hidden_act"] == "swiglu"
    old = tmp_path / "gated_layout"
    shutil.copytree(fixed, old)
    config = json.loads((old / "config.json").read_text())
    (old / "config.json").write_text(json.dumps({**config, "hidden_act": "silu"}))
    tensors = load_file(str(old / "rank0.safetensors"))
    for name in [n for n in tensors if n.endswith("mlp.fc.weight")]:
        up, gate = tensors[name].chunk(2)
        tensors[name], tensors[name.replace("mlp.fc", "mlp.gate")] = gate.contiguous(), up.contiguous()
    save_file(tensors, str(old / "rank0.safetensors"))

    prompt = _prompts("phi3")[2]
    expected = hf_greedy(family.hf_model, prompt, MAX_NEW_TOKENS)
    greedy = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0)
    assert family_engine(fixed).generate([prompt], greedy)[0].outputs[0].token_ids == expected
    logits, reference = _engine_logits(old, _batch()), _engine_logits(fixed, _batch())
    agreement, cosine = _compare(logits, reference)
    assert cosine < 0.99, f"the gated layout under silu should not compute the model (top-1 {agreement:.2f}, cosine {cosine:.4f})"
