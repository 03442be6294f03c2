"""Qwen3, Granite, Phi-3/4, StarCoder2 and Nemotron (refengine/architectures.py rows) from the checkpoints the quantize
stage writes.

Tiny random transformers models of each family (tests/refengine/family_fixtures.py) are exported through the
project's converter and run by the engine: greedy output equals transformers' `generate` token for token
(unquantized, 32 tokens, several prompts); FP8, int4 AWQ and INT8 weight-only checkpoints of every family load and agree
with the unquantized run (top-1 agreement on a fixed teacher-forced batch, thresholds below; INT8 SmoothQuant and W4A8 AWQ
load and run, agreement not yet established); every engine mechanism
(paged KV with prefix reuse, chunked prefill, inflight batching, beams) runs each family unchanged; long-RoPE
switches tables by prompt length; options refengine does not implement are refused by name.
"""

from __future__ import annotations

import json
import random
import shutil
import time

import pytest
import torch

from refengine import EngineConfig, LLMEngine, ModelLoadError, SamplingParams, load_checkpoint
from refengine.model_runner import load_model
from tests.refengine.family_fixtures import FAMILY_SPECS, LONG_ROPE_ORIGINAL, VOCAB_SIZE, build_family_model, hf_greedy
from tests.refengine.quant_fixtures import paged_prefill

MAX_NEW_TOKENS = 32
QUANTIZED = ("fp8", "int4_awq", "int8_sq", "int8_wo", "w4a8_awq")
# Against the unquantized checkpoint on a [2, 48] teacher-forced batch (96 positions): top-1 agreement and the
# minimum per-position cosine of the logits. These random tiny models have flat distributions (logit std ~0.65 over
# 256 tokens), so near-ties flip often; a Llama of the same shape through the same path measures fp8 0.82 / 0.975,
# int4_awq 0.69 / 0.933. Measured here: fp8 0.77-0.99 / 0.939-0.9999, int4_awq 0.53-0.96 / 0.784-0.9997 (Granite
# highest: its residual multiplier keeps the logits near the embedding's; Nemotron lowest, 0.573 / 0.784).
# int8_wo measures 0.958-1.0 / 0.9991-1.0. int8_sq and w4a8_awq load and run for every family, but their agreement is
# not established yet (None: only checked finite): Phi-3 int8_sq measures a min cosine of 0.67 (others 0.89-0.998),
# long-RoPE Phi-3 w4a8_awq a top-1 agreement of 0.44; that needs a comparison with ModelOpt's fake-quant model, as
# test_quantized_exports.py does for Llama, before a threshold is stated.
MIN_AGREEMENT: dict[str, tuple[float, float] | None] = {
    "fp8": (0.72, 0.92), "int4_awq": (0.5, 0.75), "int8_wo": (0.95, 0.999), "int8_sq": None, "w4a8_awq": None,
}
QUANT_ALGOS = {"fp8": "FP8", "int4_awq": "W4A16_AWQ", "int8_sq": "W8A8_SQ_PER_CHANNEL", "int8_wo": "W8A16", "w4a8_awq": "W4A8_AWQ"}


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    built = {}
    for name in FAMILY_SPECS:
        start = time.perf_counter()
        built[name] = build_family_model(name, root, formats=("fp16", *QUANTIZED))
        print(f"{name}: built in {time.perf_counter() - start:.1f} s ({built[name].seconds})")
    return built


def _engine(checkpoint_dir, **changes) -> LLMEngine:
    values = dict(tokens_per_block=8, max_num_tokens=256, max_batch_size=8)
    values.update(changes)
    return LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(**values))


def _prompts(name: str) -> list[list[int]]:
    """Several lengths; for long-RoPE, prompts that stay at or below original_max_position_embeddings with their 32
    tokens and prompts longer than it (transformers recomputes its cache where a sequence crosses it mid-generation,
    TensorRT-LLM keeps the prompt's table: see test_long_rope_table_follows_the_prompt_length)."""
    lengths = (1, 9, 23, 30, 65, 70, 100) if name == "phi3_longrope" else (1, 9, 23, 41, 70)
    rng = random.Random(len(name))
    return [[rng.randrange(3, VOCAB_SIZE) for _ in range(length)] for length in lengths]


@pytest.mark.parametrize("name", sorted(FAMILY_SPECS))
def test_greedy_matches_transformers(families, name):
    family = families[name]
    prompts = _prompts(name)
    outputs = _engine(family.checkpoints["fp16"]).generate(prompts, SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0))
    for prompt, output in zip(prompts, outputs):
        expected = hf_greedy(family.hf_model, prompt, MAX_NEW_TOKENS)
        assert output.outputs[0].token_ids == expected, f"{name}, prompt of length {len(prompt)}"


@pytest.mark.parametrize("fmt", QUANTIZED)
@pytest.mark.parametrize("name", sorted(FAMILY_SPECS))
def test_quantized_checkpoints_load_and_agree(families, name, fmt):
    family = families[name]
    config = json.loads((family.checkpoints[fmt] / "config.json").read_text())
    assert config["quantization"]["quant_algo"] == QUANT_ALGOS[fmt]
    tokens = torch.randint(3, VOCAB_SIZE, (2, 48), generator=torch.Generator().manual_seed(3)).tolist()
    reference, _ = paged_prefill(load_model(load_checkpoint(family.checkpoints["fp16"])), tokens)
    quantized, _ = paged_prefill(load_model(load_checkpoint(family.checkpoints[fmt])), tokens)
    reference = torch.cat(reference)
    quantized = torch.cat(quantized)[:, : reference.shape[1]]  # AWQ pads the vocabulary to a multiple of 64
    agreement = (reference.argmax(-1) == quantized.argmax(-1)).float().mean().item()
    cosine = torch.nn.functional.cosine_similarity(reference.double(), quantized.double(), dim=-1).min().item()
    print(f"{name} {fmt}: top-1 agreement {agreement:.3f} over {reference.shape[0]} positions, min cosine {cosine:.4f}")
    assert bool(torch.isfinite(quantized).all())
    if MIN_AGREEMENT[fmt] is not None:
        min_agreement, min_cosine = MIN_AGREEMENT[fmt]
        assert agreement >= min_agreement and cosine >= min_cosine


@pytest.mark.parametrize("name", sorted(FAMILY_SPECS))
def test_every_engine_mechanism_runs_the_family(families, name):
    """Paged KV with prefix reuse, chunked prefill (8-token chunks), inflight batching and a beam request beside the
    greedy ones: the greedy outputs are still transformers' own, and the beam request equals running alone."""
    family = families[name]
    engine = _engine(family.checkpoints["fp16"], tokens_per_block=4, max_num_tokens=8, enable_chunked_context=True,
                     enable_prefix_caching=True, max_beam_width=2)
    base = _prompts(name)[-1]  # longer than original_max_position_embeddings for long-RoPE
    prompts = [base, base[:-3] + [5, 6, 7], base[:17] + [9]]  # shared prefixes: the later ones reuse cached blocks
    greedy = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0)
    beam = SamplingParams(max_tokens=8, beam_width=2, n=2, temperature=0)
    [first] = engine.generate([prompts[0]], greedy)
    outputs = engine.generate(prompts[1:] + [prompts[0][:12]], [greedy, greedy, beam])
    assert engine.stats().num_prefix_cache_hits >= 2
    for prompt, output in zip(prompts, [first, *outputs[:2]]):
        assert output.outputs[0].token_ids == hf_greedy(family.hf_model, prompt, MAX_NEW_TOKENS), f"prompt {len(prompt)}"
    [alone] = _engine(family.checkpoints["fp16"], max_beam_width=2).generate([prompts[0][:12]], beam)
    assert [c.token_ids for c in outputs[2].outputs] == [c.token_ids for c in alone.outputs]


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
    got = _engine(family.checkpoints["fp16"], enable_prefix_caching=True).generate([crossing, long_prompt], params)
    reference = _engine(short_only).generate([crossing, long_prompt], params)
    assert got[0].outputs[0].token_ids == reference[0].outputs[0].token_ids
    assert [s.logprob for s in got[0].outputs[0].logprobs] == [s.logprob for s in reference[0].outputs[0].logprobs]
    assert [s.logprob for s in got[1].outputs[0].logprobs] != [s.logprob for s in reference[1].outputs[0].logprobs]


# A StarCoder2 checkpoint config as the converter writes it (the writer's Llama tensors are not read: refused first).
GPT = {"architecture": "Starcoder2ForCausalLM", "gpt_variant": "starcoder2", "hidden_act": "gelu", "rmsnorm": False,
       "bias": True, "position_embedding_type": "rope_gpt_neox", "q_scaling": 1.0, "apply_query_key_layer_scaling": False,
       "inner_layernorm": False}


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"architecture": "Phi3SmallForCausalLM", "blocksparse_block_size": 64, "blocksparse_vertical_stride": 8},
         "blocksparse_block_size is set: block-sparse attention (Phi-3-small)"),
        ({"architecture": "Phi3SmallForCausalLM", "gegelu_limit": 20.0}, "gegelu_limit is set"),
        ({"architecture": "PhiMoEForCausalLM", "moe": {"num_experts": 16, "top_k": 2}}, "moe.num_experts > 0"),
        ({"architecture": "Phi3ForCausalLM", "position_embedding_type": "long_rope", "original_max_position_embeddings": 64,
          "longrope_scaling_short_factors": [1.0] * 4, "longrope_scaling_long_factors": [2.0] * 4,
          "rotary_scaling": {"type": "longrope", "attention_factor": 1.3}}, "rotary_scaling.attention_factor"),
        ({"architecture": "Phi3ForCausalLM", "position_embedding_type": "long_rope"}, "original_max_position_embeddings"),
        ({"architecture": "Phi3ForCausalLM", "position_embedding_type": "alibi"}, "position_embedding_type 'alibi'"),
        ({"architecture": "Qwen3ForCausalLM", "qwen_type": "qwen3", "qk_layernorm": False}, "qk_layernorm must be true"),
        ({"architecture": "Qwen3ForCausalLM", "qwen_type": "qwen3_moe", "qk_layernorm": True}, "qwen_type 'qwen3_moe'"),
        ({"architecture": "LlamaForCausalLM", "embedding_multiplier": 12.0}, "embedding_multiplier 12.0 is not supported"),
        ({"architecture": "LlamaForCausalLM", "rotary_pct": 0.5}, "rotary_pct 0.5 is not supported"),
        ({"architecture": "GraniteForCausalLM", "residual_multiplier": -1}, "residual_multiplier must be a positive"),
        *[({**GPT, **changes}, named) for changes, named in [
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
        ]],
        ({"architecture": "LlamaForCausalLM", "hidden_act": "gelu"}, "hidden_act 'gelu' is not supported (supported: silu)"),
    ],
)
def test_options_refengine_does_not_implement_are_refused_by_name(checkpoint_writer, tmp_path, changes, named):
    directory = checkpoint_writer(tmp_path / "ckpt", **changes)
    with pytest.raises(ModelLoadError, match=named.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        load_checkpoint(directory)


def test_long_rope_factors_must_cover_the_rotary_dimension(checkpoint_writer, tmp_path):
    directory = checkpoint_writer(
        tmp_path / "ckpt", architecture="Phi3ForCausalLM", position_embedding_type="long_rope", rotary_pct=0.5,
        original_max_position_embeddings=64, longrope_scaling_short_factors=[1.0] * 4, longrope_scaling_long_factors=[2.0] * 4,
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
