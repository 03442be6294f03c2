"""Gemma, Gemma 2 and Gemma 3 text (refengine/model_runner/gemma.py) from the checkpoints the quantize stage writes.

Tiny random transformers models (tests/support/gemma_fixtures.py, 16-token windows) exported through the
project's converter: greedy output equals transformers' `generate` (eager attention) token for token, 32 tokens,
prompts shorter and much longer than the window; beam search equals transformers' for Gemma 3; every engine
mechanism (paged KV with prefix reuse, chunked prefill, inflight batching, beams with copy-on-write, speculative
and guided decoding, streaming) runs the windowed families unchanged; options refengine does not implement are
refused at load by name; a request past Gemma 2's window limit is refused naming it.
"""

from __future__ import annotations

import json
import random
import re
import shutil

import pytest
import torch

from refengine import EngineConfig, InvalidRequestError, LLMEngine, ModelLoadError, SamplingParams, load_checkpoint
from refengine.gemma_options import GEMMA2_WINDOW
from refengine.model_runner import load_model
from tests.refengine.conftest import hf_greedy
from tests.support.gemma_fixtures import VOCAB_SIZE, WINDOW, build_gemma_models

MAX_NEW_TOKENS = 32
WINDOWED = ("gemma2_windowed", "gemma3_text")


@pytest.fixture(scope="module")
def gemmas(tmp_path_factory):
    return build_gemma_models(tmp_path_factory.mktemp("gemma"))


def _engine(checkpoint_dir, **changes) -> LLMEngine:
    values = dict(tokens_per_block=8, max_num_tokens=256, max_batch_size=8)
    values.update(changes)
    return LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(**values))


def _prompts(name: str, lengths=(1, 9, 23, 41, 70)) -> list[list[int]]:
    rng = random.Random(len(name))
    return [[rng.randrange(3, VOCAB_SIZE) for _ in range(length)] for length in lengths]


@pytest.mark.parametrize("name", ["gemma", *WINDOWED])
def test_greedy_matches_transformers(gemmas, name):
    """Prompts of 1 to 70 tokens (the window is 16), 32 generated tokens each, batched together."""
    model = gemmas[name]
    prompts = _prompts(name)
    outputs = _engine(model.checkpoint_dir).generate(prompts, SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0))
    distinct = set()
    for prompt, output in zip(prompts, outputs):
        expected = hf_greedy(model.hf_model, prompt, MAX_NEW_TOKENS)
        assert output.outputs[0].token_ids == expected, f"{name}, prompt of length {len(prompt)}"
        distinct.update(expected)
    assert len(distinct) > 10  # the outputs vary: a comparison of repeated tokens would prove little


def test_windows_change_the_output(gemmas):
    """The windowed and the unwindowed Gemma 2 checkpoints (same weights) part where a sequence passes the window."""
    prompt = _prompts("gemma2", lengths=(40,))[0]
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=1)
    [windowed] = _engine(gemmas["gemma2_windowed"].checkpoint_dir).generate([prompt], params)
    [whole] = _engine(gemmas["gemma2"].checkpoint_dir).generate([prompt], params)
    assert [s.logprob for s in windowed.outputs[0].logprobs] != [s.logprob for s in whole.outputs[0].logprobs]
    short = prompt[: WINDOW - 8]  # prompt + 8 tokens within the window: the same computation
    [windowed], [whole] = (_engine(gemmas[n].checkpoint_dir).generate([short], params) for n in ("gemma2_windowed", "gemma2"))
    assert [s.logprob for s in windowed.outputs[0].logprobs] == [s.logprob for s in whole.outputs[0].logprobs]


def hf_beams(model, prompt, *, beams, max_new_tokens, num_return):
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            num_beams=beams,
            num_return_sequences=num_return,
            max_new_tokens=max_new_tokens,
            eos_token_id=None,
            pad_token_id=0,
            return_dict_in_generate=True,
            output_scores=True,
        )
    return [(tuple(row[len(prompt) :].tolist()), float(score)) for row, score in zip(out.sequences, out.sequences_scores)]


@pytest.mark.parametrize(("length", "beams", "max_tokens"), [(5, 4, 14), (20, 4, 8), (30, 2, 10)])
def test_gemma3_beam_search_matches_transformers(gemmas, length, beams, max_tokens):
    model = gemmas["gemma3_text"]
    engine = _engine(model.checkpoint_dir, tokens_per_block=4, max_num_tokens=64, max_beam_width=4)
    prompt = _prompts("beams", lengths=(length,))[0]
    params = SamplingParams(max_tokens=max_tokens, beam_width=beams, n=beams, temperature=0)
    [output] = engine.generate([prompt], params)
    expected = hf_beams(model.hf_model, prompt, beams=beams, max_new_tokens=max_tokens, num_return=beams)
    assert [c.token_ids for c in output.outputs] == [tokens for tokens, _ in expected]
    assert [c.cum_log_prob / len(c.token_ids) for c in output.outputs] == pytest.approx([s for _, s in expected], abs=1e-4)


@pytest.mark.parametrize("name", WINDOWED)
def test_every_engine_mechanism_runs_the_family(gemmas, name):
    """Prefix reuse, chunked prefill (8-token chunks: windows span chunks), inflight batching and a beam request
    beside greedy ones: the greedy outputs are still transformers' own, the beams equal running alone."""
    model = gemmas[name]
    engine = _engine(model.checkpoint_dir, tokens_per_block=4, max_num_tokens=8, enable_chunked_context=True, enable_prefix_caching=True, max_beam_width=2)
    base = _prompts(name)[-1]
    prompts = [base, base[:-3] + [5, 6, 7], base[:17] + [9]]
    greedy = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0)
    beam = SamplingParams(max_tokens=8, beam_width=2, n=2, temperature=0)
    [first] = engine.generate([prompts[0]], greedy)
    outputs = engine.generate(prompts[1:] + [prompts[0][:30]], [greedy, greedy, beam])
    assert engine.stats().num_prefix_cache_hits >= 2
    for prompt, output in zip(prompts, [first, *outputs[:2]]):
        assert output.outputs[0].token_ids == hf_greedy(model.hf_model, prompt, MAX_NEW_TOKENS), f"prompt {len(prompt)}"
    [alone] = _engine(model.checkpoint_dir, max_beam_width=2).generate([prompts[0][:30]], beam)
    assert [c.token_ids for c in outputs[2].outputs] == [c.token_ids for c in alone.outputs]


@pytest.mark.parametrize("name", WINDOWED)
def test_speculative_decoding_equals_plain_greedy(gemmas, name):
    """n-gram drafts and a draft model (the target itself: every draft accepted, k + 1 tokens a step)."""
    from refengine.speculative.draft_model import DraftModelDrafter
    from refengine.speculative.ngram import NGramDrafter

    model = gemmas[name]
    target = load_model(load_checkpoint(model.checkpoint_dir))
    config = EngineConfig(tokens_per_block=4, max_num_tokens=128, max_batch_size=4, max_draft_len=3)
    prompts = _prompts(name, lengths=(9, 41)) + [[7, 8, 9, 10] * 6]
    greedy = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0)
    for drafter in (NGramDrafter(3), DraftModelDrafter(load_model(load_checkpoint(model.checkpoint_dir)), 256, 4)):
        engine = LLMEngine(target, config, drafter)
        outputs = engine.generate(prompts, greedy)
        for prompt, output in zip(prompts, outputs):
            assert output.outputs[0].token_ids == hf_greedy(model.hf_model, prompt, MAX_NEW_TOKENS)
        assert engine.stats().num_accepted_draft_tokens > 0


def test_guided_decoding_and_streaming(gemmas):
    import xgrammar as xgr

    from refengine.guided.params import GuidedDecodingParams

    vocab = ["<pad>", "<eos>"] + [chr(c) for c in range(32, 127)]
    vocab += [f"<x{i}>" for i in range(VOCAB_SIZE - len(vocab))]
    engine = _engine(gemmas["gemma3_text"].checkpoint_dir)
    engine.enable_guided_decoding(xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=VOCAB_SIZE, stop_token_ids=[1]))
    regex = r"(ab|cd){2,6}-[0-9]{2}"
    params = SamplingParams(max_tokens=40, temperature=0, end_id=1, guided_decoding=GuidedDecodingParams("regex", regex))
    prompt = _prompts("guided", lengths=(30,))[0]
    [output] = engine.generate([prompt], params)
    assert re.fullmatch(regex, "".join(vocab[t] for t in output.outputs[0].token_ids if t != 1))
    request_id = engine.add_request(prompt, SamplingParams(max_tokens=12, temperature=0))
    streamed = []
    while engine.has_unfinished():
        for update in engine.step():
            if update.request_id == request_id:
                streamed.append(update.outputs[0].new_token_ids)
    assert len(streamed) == 12 and sum(streamed, ()) == hf_greedy(gemmas["gemma3_text"].hf_model, prompt, 12)


def test_gemma2_requests_past_its_window_limit_are_refused(gemmas):
    """The converter's Gemma 2 checkpoint carries no window: requests up to 4096 tokens (where the local layers'
    window covers the whole sequence) run, longer ones are refused naming the limit; with the window, none is."""
    config = dict(max_seq_len=8192, max_input_len=8192, max_num_tokens=8192, num_kv_blocks=1100)
    engine = _engine(gemmas["gemma2"].checkpoint_dir, **config)
    with pytest.raises(InvalidRequestError, match=f"= {GEMMA2_WINDOW + 1} exceeds {GEMMA2_WINDOW} tokens, this model's window limit"):
        engine.add_request([5] * 4000, SamplingParams(max_tokens=GEMMA2_WINDOW + 1 - 4000))
    engine.add_request([5] * 4000, SamplingParams(max_tokens=GEMMA2_WINDOW - 4000))
    _engine(gemmas["gemma2_windowed"].checkpoint_dir, **config).add_request([5] * 4000, SamplingParams(max_tokens=200))


@pytest.mark.parametrize(
    ("source", "changes", "named"),
    [
        ("gemma3_text", {"architecture": "Gemma3ForConditionalGeneration"}, "Gemma 3's vision tower (vision_config) is not supported"),
        ("gemma3_text", {"vision_config": {"hidden_size": 1152}}, "vision_config is set: Gemma 3's vision tower is not supported"),
        ("gemma3_text", {"qk_layernorm": False}, "qk_layernorm is False; gemma3_text has true"),
        ("gemma3_text", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping is set; gemma3_text has no attention soft-capping"),
        ("gemma3_text", {"_sliding_window_pattern": None}, "'_sliding_window_pattern' must be a positive integer"),
        ("gemma3_text", {"rope_local_base_freq": None}, "'rope_local_base_freq' must be a positive number"),
        ("gemma2", {"inter_layernorms": False}, "inter_layernorms is False; gemma2 has true"),
        ("gemma2", {"query_pre_attn_scalar": None}, "'query_pre_attn_scalar' must be a positive number"),
        ("gemma2", {"hidden_act": "relu"}, "hidden_act 'relu' is not supported for gemma2 (supported: gelu, gelu_pytorch_tanh)"),
        ("gemma2", {"use_bidirectional_attention": True}, "use_bidirectional_attention is true"),
        ("gemma", {"sliding_window": 16}, "sliding_window is set; Gemma 1 has no sliding-window layers"),
        ("gemma", {"moe": {"num_experts": 4, "top_k": 2}}, "moe.num_experts > 0"),
    ],
)
def test_options_refengine_does_not_implement_are_refused_by_name(gemmas, tmp_path, source, changes, named):
    directory = tmp_path / "ckpt"
    shutil.copytree(gemmas[source].checkpoint_dir, directory)
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=re.escape(named)):
        LLMEngine.from_checkpoint(directory)


def test_window_mask_convention():
    """A query at position p attends to the keys at (p - W, p]: W keys, itself included (transformers' convention),
    in a prefill, a later chunk and a decode step alike; soft-capping bends the scores before the mask."""
    from refengine.model_runner.attention import causal_attention

    generator = torch.Generator().manual_seed(0)
    query, keys, values = (torch.randn(shape, generator=generator) for shape in ((10, 4, 8), (10, 2, 8), (10, 2, 8)))
    window, scale = 3, 8**-0.5
    full = causal_attention(query, keys, values, scale, window, softcap=2.0)
    for position in range(10):
        begin = max(0, position - window + 1)
        ref_keys = keys[begin : position + 1].repeat_interleave(2, dim=1)
        ref_values = values[begin : position + 1].repeat_interleave(2, dim=1)
        scores = torch.tanh(torch.einsum("hd,khd->hk", query[position], ref_keys) * scale / 2.0) * 2.0
        expected = torch.einsum("hk,khd->hd", scores.softmax(-1), ref_values)
        torch.testing.assert_close(full[position], expected)
        # the same rows computed as a chunk or a decode step (the last queries over every key so far)
        chunk = causal_attention(query[position : position + 1], keys[: position + 1], values[: position + 1], scale, window, 2.0)
        torch.testing.assert_close(chunk[0], full[position])


def test_gemma3_checkpoint_keeps_the_global_and_local_rope(gemmas):
    """transformers 5 keeps Gemma 3's RoPE per layer type; the converter writes the global layers' as rotary_base /
    rotary_scaling and the local layers' base as rope_local_base_freq."""
    config = json.loads((gemmas["gemma3_text"].checkpoint_dir / "config.json").read_text())
    assert config["rotary_base"] == 1000000.0 and config["rotary_scaling"]["type"] == "linear"
    assert config["rotary_scaling"]["factor"] == 8.0 and config["rope_local_base_freq"] == 10000.0


def test_kv_blocks_of_a_4k_token_gemma3_sequence(gemmas, checkpoint_writer, tmp_path):
    """refengine: a 4096-token Gemma 3 sequence holds as many blocks as one of a full-attention model of the same size
    (one block table for every layer, kv_cache/windows.py); per-window pools (TensorRT-LLM) would hold far fewer."""
    from refengine.kv_cache.windows import layer_blocks_held

    # the same KV per token: 4 layers, 2 KV heads of 32 (the writer takes head_size = hidden / heads)
    llama = checkpoint_writer(
        tmp_path / "llama",
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=8192,
    )
    prompt = [random.Random(4).randrange(3, VOCAB_SIZE) for _ in range(4096)]
    held = {}
    for name, directory in (("gemma3_text", gemmas["gemma3_text"].checkpoint_dir), ("llama", llama)):
        engine = _engine(
            directory, tokens_per_block=32, max_seq_len=4200, max_input_len=4096, max_num_tokens=4096, max_batch_size=1, enable_chunked_context=True
        )
        engine.add_request(prompt, SamplingParams(max_tokens=2, temperature=0))
        engine.step()  # the prompt's prefill; its one sampled token has no slot yet
        held[name] = engine.kv_cache_usage().num_used_blocks
    assert held == {"gemma3_text": 128, "llama": 128}
    windows = gemmas["gemma3_text"].hf_model.config.layer_types  # tiny model: 16-token windows on 3 of 4 layers
    assert layer_blocks_held(4096, 32, [WINDOW if t == "sliding_attention" else None for t in windows]) == (512, 131)
    # Gemma 3 1B's layout: 26 layers, every sixth global, 512-token windows
    gemma3_1b = [None if (i + 1) % 6 == 0 else 512 for i in range(26)]
    assert layer_blocks_held(4096, 32, gemma3_1b) == (3328, 4 * 128 + 22 * 16)
    assert layer_blocks_held(4100, 32, gemma3_1b) == (26 * 129, 4 * 129 + 22 * 17)
