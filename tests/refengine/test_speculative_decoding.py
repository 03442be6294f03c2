"""Speculative decoding on refengine: greedy output equals plain greedy, sampled output is
distributed as the target's, rejected drafts' KV is rolled back, bad settings are refused."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from refengine import EngineConfig, EngineConfigError, InvalidRequestError, LLMEngine, SamplingParams, load_checkpoint
from refengine.model_runner import load_model
from refengine.speculative.draft_model import DraftModelDrafter
from refengine.speculative.ngram import NGramDrafter, propose_ngram
from refengine.speculative.planner import AdaptiveDraftLength, DraftRequest
from refengine.speculative.settings import write_speculative_section

VOCAB = 48
NOISE = 0.15  # relative noise of the "noisy" draft: it agrees with the target often, not always
CONFIG = EngineConfig(max_batch_size=6, max_input_len=48, max_seq_len=96, max_num_tokens=96, tokens_per_block=4)
# Repetitive prompts (n-gram drafts find matches) and plain ones.
PROMPTS = [
    [1, 5, 9, 5, 9, 5, 9, 5],
    [3, 4, 5, 6, 7, 3, 4, 5],
    [10, 20, 30],
    [7] * 12,
    [2, 40, 17, 2, 40, 17, 2, 40],
    list(range(1, 30)),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory, checkpoint_writer, tensor_rewriter):
    """A target, a draft that is a noisy copy of it (partial acceptance), and an unrelated draft."""
    root = tmp_path_factory.mktemp("spec")
    target_dir = checkpoint_writer(root / "target", seed=3, vocab_size=VOCAB, num_hidden_layers=2)
    noisy_dir = checkpoint_writer(root / "noisy", seed=3, vocab_size=VOCAB, num_hidden_layers=2)
    generator = torch.Generator().manual_seed(9)

    def perturb(tensors):
        for name, tensor in tensors.items():
            if tensor.dim() == 2:
                noise = NOISE * tensor.float().std() * torch.randn(tensor.shape, generator=generator)
                tensors[name] = (tensor.float() + noise).half()

    tensor_rewriter(noisy_dir, perturb)
    other_dir = checkpoint_writer(root / "other", seed=11, vocab_size=VOCAB, num_hidden_layers=1)
    return {name: load_model(load_checkpoint(path)) for name, path in (("target", target_dir), ("noisy", noisy_dir), ("other", other_dir))} | {
        "dirs": {"target": target_dir, "noisy": noisy_dir, "other": other_dir, "root": root}
    }


LEAN_SLOTS = (CONFIG.max_batch_size, CONFIG.max_seq_len)
DRAFT_VOCAB = 32  # of VOCAB 48: the lean draft's lm_head keeps the first 32 ids


def _drafter(models, kind: str):
    if kind == "ngram":
        return NGramDrafter(3)
    if kind.startswith("noisy-lean"):
        vocab = DRAFT_VOCAB if kind.endswith("vocab") else None
        drafter = DraftModelDrafter(models["noisy"], 256, CONFIG.tokens_per_block, vocab_size=vocab, lean_slots=LEAN_SLOTS)
        assert drafter.is_lean
        return drafter
    return DraftModelDrafter(models[kind], num_blocks=256, tokens_per_block=CONFIG.tokens_per_block)


def _tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


CHUNKED_PREFIX = {"enable_chunked_context": True, "max_num_tokens": 7, "enable_prefix_caching": True}
PREEMPTING = {"scheduler_policy": "max_utilization", "num_kv_blocks": 14}


@pytest.mark.parametrize(
    "kind, changes",
    [(kind, changes) for kind in ("ngram", "noisy") for changes in ({}, CHUNKED_PREFIX, PREEMPTING)]
    + [("other", PREEMPTING), ("noisy-lean", PREEMPTING), ("noisy-lean-vocab", CHUNKED_PREFIX)],
    ids=[f"{kind}-{name}" for kind in ("ngram", "noisy") for name in ("default", "chunked+prefix", "preempting")]
    + ["other-preempting", "noisy-lean-preempting", "noisy-lean-vocab-chunked+prefix"],
)
def test_greedy_speculation_equals_plain_greedy(models, kind, changes):
    config = CONFIG.replace(**changes)
    params = [
        SamplingParams(max_tokens=m, temperature=0, stop_token_ids=stop, end_id=end)
        for m, stop, end in itertools.islice(itertools.cycle([(20, (), None), (9, ((5, 9),), None), (17, (), 3)]), len(PROMPTS))
    ]
    plain = LLMEngine(models["target"], config).generate(PROMPTS, params)
    engine = LLMEngine(models["target"], config.replace(max_draft_len=4), _drafter(models, kind))
    speculative = engine.generate(PROMPTS, params)
    assert _tokens(speculative) == _tokens(plain)
    assert [o.outputs[0].finish_reason for o in speculative] == [o.outputs[0].finish_reason for o in plain]
    for output, p in zip(speculative, params):
        assert len(output.outputs[0].token_ids) <= p.max_tokens  # max_tokens ends exactly: no overshoot
        assert 0 <= output.metrics.total_accepted_draft_tokens <= output.metrics.total_draft_tokens
    stats = engine.stats()
    assert stats.num_draft_tokens == sum(o.metrics.total_draft_tokens for o in speculative) > 0
    if kind.startswith("noisy"):
        assert 0.2 < stats.num_accepted_draft_tokens / stats.num_draft_tokens < 1.0
    if changes.get("scheduler_policy") == "max_utilization":
        assert engine.scheduler.num_preemptions > 0
    # Rolled back and freed: nothing held once every request ended (the target's cache, the draft's).
    assert engine.kv_cache_usage().num_used_blocks == 0


def test_draft_equal_to_the_target_is_always_accepted_and_a_step_yields_k_plus_one_tokens(models):
    engine = LLMEngine(models["target"], CONFIG.replace(max_draft_len=3), _drafter({"target": models["target"]}, "target"))
    [output] = engine.generate([PROMPTS[2]], SamplingParams(max_tokens=17, temperature=0))
    assert output.metrics.acceptance_rate == 1.0
    assert len(output.outputs[0].token_ids) == 17
    # 4 tokens per step (3 drafts + 1, the prompt's step included); the 5th step makes the 17th alone
    assert engine.stats().num_steps == 5


def test_streaming_delivers_several_tokens_per_response(models):
    engine = LLMEngine(models["target"], CONFIG.replace(max_draft_len=4), _drafter({"target": models["target"]}, "target"))
    outputs = list(engine.stream(PROMPTS[0], SamplingParams(max_tokens=12, temperature=0)))
    sizes = [len(o.outputs[0].new_token_ids) for o in outputs]
    assert sum(sizes) == 12 and max(sizes) == 5  # one response per step: all tokens the step accepted
    plain = LLMEngine(models["target"], CONFIG).generate([PROMPTS[0]], SamplingParams(max_tokens=12, temperature=0))
    assert outputs[-1].outputs[0].token_ids == plain[0].outputs[0].token_ids


def test_per_request_num_draft_tokens(models):
    engine = LLMEngine(models["target"], CONFIG.replace(max_draft_len=4), _drafter(models, "noisy"))
    off, two = engine.generate([PROMPTS[0]] * 2, [SamplingParams(max_tokens=10, temperature=0, num_draft_tokens=n) for n in (0, 2)])
    assert off.metrics.total_draft_tokens == 0
    assert 0 < two.metrics.total_draft_tokens <= 2 * 10


def test_logprobs_of_accepted_tokens_match_plain_decoding(models):
    params = SamplingParams(max_tokens=10, temperature=0, logprobs=2)
    plain = LLMEngine(models["target"], CONFIG).generate([PROMPTS[1]], params)[0].outputs[0].logprobs
    engine = LLMEngine(models["target"], CONFIG.replace(max_draft_len=4), _drafter({"target": models["target"]}, "target"))
    got = engine.generate([PROMPTS[1]], params)[0].outputs[0].logprobs
    assert [t.token_id for t in got] == [t.token_id for t in plain]
    assert [t.logprob for t in got] == pytest.approx([t.logprob for t in plain], abs=1e-4)


def test_lean_draft_proposes_what_the_general_path_proposes(models):
    requests = [DraftRequest(i, tuple(prompt), 4, SamplingParams(temperature=0), 0, 0) for i, prompt in enumerate(PROMPTS)]
    general = DraftModelDrafter(models["noisy"], 256, CONFIG.tokens_per_block).propose(requests)
    lean = _drafter(models, "noisy-lean")
    assert lean.propose(requests) == general
    # a rolled-back continuation (the last two tokens replaced) drafts from the kept prefix, as the general path does
    changed = [dataclasses.replace(r, token_ids=r.token_ids[:-2] + (7, 8)) for r in requests]
    assert lean.propose(changed) == DraftModelDrafter(models["noisy"], 256, CONFIG.tokens_per_block).propose(changed)
    cut = _drafter(models, "noisy-lean-vocab").propose(requests)
    assert all(token < DRAFT_VOCAB for draft in cut.values() for token in draft.token_ids)


def test_adaptive_draft_length_follows_the_drafts_fate():
    schedule = AdaptiveDraftLength(4)
    assert schedule.next_length(0, 0) == 4  # nothing drafted yet: max_draft_len
    assert schedule.next_length(4, 1) == 3  # a miss: one fewer
    assert schedule.next_length(7, 2) == 2
    assert schedule.next_length(9, 4) == 4  # all accepted: two more (capped at max_draft_len)
    assert schedule.next_length(9, 4) == 4  # no drafts in between: unchanged
    assert [schedule.next_length(9 + 4 * i, 4) for i in range(1, 6)] == [3, 2, 1, 1, 1]  # at least 1


def test_a_request_without_num_draft_tokens_drafts_less_with_a_poor_draft(models):
    engine = LLMEngine(models["target"], CONFIG.replace(max_draft_len=4), _drafter(models, "other"))
    adaptive, fixed = engine.generate([PROMPTS[5]] * 2, [SamplingParams(max_tokens=20, temperature=0, num_draft_tokens=n) for n in (None, 4)])
    assert adaptive.outputs[0].token_ids == fixed.outputs[0].token_ids
    assert 0 < adaptive.metrics.total_draft_tokens < fixed.metrics.total_draft_tokens


def test_ngram_proposes_what_followed_the_latest_match():
    assert propose_ngram([1, 2, 3, 9, 1, 2, 3, 8, 1, 2], 3, 2) == (3, 8)
    assert propose_ngram([4, 5, 6], 3, 2) == ()
    assert propose_ngram([7, 7, 7], 2, 4) == (7,)


# -- bad inputs ------------------------------------------------------------------------------
def test_request_draft_length_is_checked_against_the_build(models):
    engine = LLMEngine(models["target"], CONFIG.replace(max_draft_len=2), NGramDrafter(3))
    with pytest.raises(InvalidRequestError, match="num_draft_tokens.*3 exceeds the engine's max_draft_len 2"):
        engine.add_request([1, 2], SamplingParams(num_draft_tokens=3))
    plain = LLMEngine(models["target"], CONFIG)
    with pytest.raises(InvalidRequestError, match="num_draft_tokens.*built without speculative decoding"):
        plain.add_request([1, 2], SamplingParams(num_draft_tokens=1))
    with pytest.raises(InvalidRequestError, match="num_draft_tokens"):
        SamplingParams(num_draft_tokens=-1)
    plain.add_request([1, 2], SamplingParams(num_draft_tokens=0))  # 0 is "off": fine anywhere


def _engine_dir(models, name: str, build_changes=None) -> Path:
    from refengine import write_engine_dir

    build = {"max_batch_size": 4, "max_input_len": 48, "max_seq_len": 96, "max_num_tokens": 96, "plugin_config": {"tokens_per_block": 4}}
    build.update(build_changes or {})
    return write_engine_dir(models["dirs"][name], models["dirs"]["root"] / f"engine_{name}_{next(_ENGINE_NUMBERS)}", build, "test")


_ENGINE_NUMBERS = itertools.count()


def _edit(engine_dir: Path, change) -> None:
    config = json.loads((engine_dir / "config.json").read_text())
    change(config)
    (engine_dir / "config.json").write_text(json.dumps(config))


def test_use_draft_logits_needs_a_draft_model_and_drafts(models):
    target, draft = models["target"], models["noisy"]
    config = CONFIG.replace(max_draft_len=2)
    cases = [
        (LLMEngine(target, CONFIG), SamplingParams(use_draft_logits=True), "built without speculative decoding"),
        (LLMEngine(target, config, NGramDrafter(3)), SamplingParams(use_draft_logits=True), "drafting n-grams"),
        (
            LLMEngine(target, config, DraftModelDrafter(draft, 256, CONFIG.tokens_per_block)),
            SamplingParams(use_draft_logits=True, num_draft_tokens=0),
            "num_draft_tokens 0",
        ),
    ]
    for engine, params, message in cases:
        with pytest.raises(InvalidRequestError, match=message) as error:
            engine.add_request([1, 2, 3], params)
        assert error.value.field == "use_draft_logits"
    with pytest.raises(InvalidRequestError) as error:
        SamplingParams(use_draft_logits=1)
    assert error.value.field == "use_draft_logits"
    engine = LLMEngine(target, config, DraftModelDrafter(draft, 256, CONFIG.tokens_per_block))
    [output] = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0, use_draft_logits=True))
    assert output.metrics.total_draft_tokens > 0


def test_engine_directory_with_a_draft_model_loads_and_speculates(models):
    engine_dir = _engine_dir(models, "target")
    # the draft as the cpu build makes it: the target's max_seq_len (drafts stay within prompt + max_tokens)
    _engine_dir_draft = _engine_dir(models, "noisy", {"max_seq_len": 96})
    (engine_dir / "draft").symlink_to(_engine_dir_draft)
    write_speculative_section(engine_dir, "draft_model", 4, "draft")
    engine = LLMEngine.from_engine_dir(engine_dir)
    assert engine.config.max_draft_len == 4
    [output] = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=12, temperature=0))
    assert output.metrics.total_draft_tokens > 0
    ngram_dir = _engine_dir(models, "target")
    write_speculative_section(ngram_dir, "ngram", 3, max_matching_ngram_size=2)
    assert LLMEngine.from_engine_dir(ngram_dir).config.max_draft_len == 3


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda c: c["refengine_speculative"].update(kind="eagle"), "refengine_speculative.kind"),
        (lambda c: (c["refengine_speculative"].update(max_draft_len=0), c["build_config"].update(max_draft_len=0)), "refengine_speculative.max_draft_len"),
        (lambda c: c["build_config"].update(max_draft_len=5), "refengine_speculative.max_draft_len"),
        (lambda c: c["build_config"].update(speculative_decoding_mode=4), "build_config.speculative_decoding_mode"),
        (lambda c: c.pop("refengine_speculative"), "refengine_speculative"),
        (lambda c: c["refengine_speculative"].update(draft_engine_dir="missing"), "refengine_speculative.draft_engine_dir"),
        (lambda c: c["refengine_speculative"].update(draft_vocab_size=0), "refengine_speculative.draft_vocab_size"),
        (lambda c: c["refengine_speculative"].update(draft_vocab_size=10**6), "refengine_speculative.draft_vocab_size"),
    ],
    ids=["kind", "zero", "mismatch", "mode", "missing-section", "missing-draft", "draft-vocab", "draft-vocab-above"],
)
def test_bad_speculative_settings_are_refused_by_field(models, edit, field):
    engine_dir = _engine_dir(models, "target")
    (engine_dir / "draft").symlink_to(_engine_dir(models, "noisy", {"max_seq_len": 100}))
    write_speculative_section(engine_dir, "draft_model", 4, "draft")
    _edit(engine_dir, edit)
    with pytest.raises(EngineConfigError) as error:
        LLMEngine.from_engine_dir(engine_dir)
    assert error.value.field == field


def test_a_draft_that_does_not_fit_the_target_is_refused(models, checkpoint_writer):
    root = models["dirs"]["root"]
    engine_dir = _engine_dir(models, "target")
    (engine_dir / "draft").symlink_to(_engine_dir(models, "noisy", {"max_seq_len": 95}))  # 96 needed
    write_speculative_section(engine_dir, "draft_model", 4, "draft")
    with pytest.raises(EngineConfigError, match="95 cannot hold the target's max_seq_len 96"):
        LLMEngine.from_engine_dir(engine_dir)
    other_vocab = checkpoint_writer(root / "vocab64", seed=1, vocab_size=64)
    engine_dir = _engine_dir(models, "target")
    models["dirs"]["vocab64"] = other_vocab
    (engine_dir / "draft").symlink_to(_engine_dir(models, "vocab64", {"max_seq_len": 100}))
    write_speculative_section(engine_dir, "draft_model", 4, "draft")
    with pytest.raises(EngineConfigError, match="draft vocab_size 64 differs from the target's 48") as error:
        LLMEngine.from_engine_dir(engine_dir)
    assert error.value.field == "refengine_speculative.draft_engine_dir"


def test_a_draft_with_another_tokenizer_is_refused(models):
    engine_dir = _engine_dir(models, "target")
    draft = _engine_dir(models, "noisy", {"max_seq_len": 100})
    (engine_dir / "draft").symlink_to(draft)
    (engine_dir / "tokenizer.json").write_text('{"model": "target"}')
    (draft / "tokenizer.json").write_text('{"model": "another"}')
    write_speculative_section(engine_dir, "draft_model", 4, "draft")
    with pytest.raises(EngineConfigError, match="tokenizer.json differs from the target's"):
        LLMEngine.from_engine_dir(engine_dir)


def test_an_engine_config_asking_for_drafts_needs_a_drafter_and_inflight_batching(models):
    with pytest.raises(EngineConfigError, match="max_draft_len"):
        LLMEngine(models["target"], CONFIG.replace(max_draft_len=2))
    with pytest.raises(EngineConfigError, match="batching"):
        CONFIG.replace(max_draft_len=2, batching="static")


# -- the sampling distribution -----------------------------------------------------------------
SAMPLE_VOCAB = 6
NUM_SAMPLES = 500


@pytest.fixture(scope="module")
def sample_models(tmp_path_factory, checkpoint_writer, tensor_rewriter):
    root = tmp_path_factory.mktemp("sampling")
    target = checkpoint_writer(root / "t", seed=21, vocab_size=SAMPLE_VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=1)
    draft = checkpoint_writer(root / "d", seed=22, vocab_size=SAMPLE_VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=1)
    scale = lambda tensors: tensors.update(  # noqa: E731 - sharper distributions than the 0.1-scale init
        {"lm_head.weight": tensors["lm_head.weight"] * 6}
    )
    tensor_rewriter(target, scale)
    tensor_rewriter(draft, scale)
    return load_model(load_checkpoint(target)), load_model(load_checkpoint(draft))


def _exact_joint(model, prompt: list[int], length: int, temperature: float) -> dict[tuple[int, ...], float]:
    """P(first `length` tokens) under plain sampling, from the model's own logits."""
    engine = LLMEngine(model, EngineConfig(max_batch_size=64, max_input_len=32, max_seq_len=48, max_num_tokens=2048, tokens_per_block=4))
    joint = {(): 1.0}
    for _ in range(length):
        prefixes = list(joint)
        outs = engine.generate([prompt + list(p) for p in prefixes], SamplingParams(max_tokens=1, return_context_logits=True, temperature=0))
        joint = {
            prefix + (token,): joint[prefix] * float(probability)
            for prefix, out in zip(prefixes, outs)
            for token, probability in enumerate(torch.softmax(out.context_logits[-1] / temperature, dim=-1))
        }
    return joint


def _chi_square(counts: dict, expected_probs: dict, total: int) -> tuple[float, int]:
    """Pearson's statistic over cells with expected count >= 5 (the rest pooled into one cell)."""
    statistic, pooled_observed, pooled_expected, cells = 0.0, 0, 0.0, 0
    for cell, probability in expected_probs.items():
        expected = probability * total
        if expected >= 5:
            statistic += (counts.get(cell, 0) - expected) ** 2 / expected
            cells += 1
        else:
            pooled_observed += counts.get(cell, 0)
            pooled_expected += expected
    if pooled_expected > 0:
        statistic += (pooled_observed - pooled_expected) ** 2 / max(pooled_expected, 1e-9)
        cells += 1
    return statistic, cells - 1


@pytest.mark.parametrize("kind", ["draft_model", "ngram", "draft_model-lean-vocab", "draft_model-token-compare"])
def test_sampled_speculation_is_distributed_as_the_target(sample_models, kind):
    """Chi-square goodness of fit of the first 3 sampled tokens (6^3 cells, pooled where fewer than
    5 are expected; the sharp tiny model puts most mass on a few dozen) against the target's exact joint distribution.

    The bound: the 1 - 1e-4 quantile of chi-square with the test's degrees of freedom, so a correct
    sampler fails with probability 1e-4 over seeds (the seeds are fixed: the test is deterministic).
    Power: the same statistic against the draft's own distribution (what a sampler that kept every
    draft would produce) must exceed the bound by far, so the test can tell the two apart."""
    from scipy.stats import chi2

    target, draft = sample_models
    prompt = [4, 0, 5]
    if kind == "ngram":  # a prompt repeating the target's likely continuation, so n-gram drafts are often accepted
        [greedy] = LLMEngine(target, CONFIG).generate([prompt], SamplingParams(max_tokens=3, temperature=0))
        prompt = prompt + list(greedy.outputs[0].token_ids) + prompt
    temperature = 1.0
    drafter = NGramDrafter(3) if kind == "ngram" else DraftModelDrafter(draft, 512, 4)
    if kind == "draft_model-lean-vocab":  # q is zero on ids 4 and 5, which the draft never proposes
        drafter = DraftModelDrafter(draft, 512, 4, vocab_size=4, lean_slots=(100, 48))
        assert drafter.is_lean
    config = EngineConfig(
        max_batch_size=100, max_input_len=32, max_seq_len=48, max_num_tokens=2048, tokens_per_block=4, max_draft_len=2, scheduler_policy="max_utilization"
    )
    engine = LLMEngine(target, config, drafter)
    use_draft_logits = False if kind == "draft_model-token-compare" else None  # accepted by comparing tokens, q one-hot
    outputs = engine.generate(
        [prompt] * NUM_SAMPLES, [SamplingParams(max_tokens=3, temperature=temperature, seed=i, use_draft_logits=use_draft_logits) for i in range(NUM_SAMPLES)]
    )
    counts: dict[tuple[int, ...], int] = {}
    for output in outputs:
        cell = tuple(output.outputs[0].token_ids)
        counts[cell] = counts.get(cell, 0) + 1
    stats = engine.stats()
    assert 0 < stats.num_accepted_draft_tokens < stats.num_draft_tokens  # both accept and reject paths ran
    if kind == "draft_model-token-compare":  # the setting took effect: q accepts more often (min(p, q) >= p q)
        by_q = LLMEngine(target, config, DraftModelDrafter(draft, 512, 4))
        by_q.generate([prompt] * NUM_SAMPLES, [SamplingParams(max_tokens=3, temperature=temperature, seed=i) for i in range(NUM_SAMPLES)])
        q_stats = by_q.stats()
        assert stats.num_accepted_draft_tokens / stats.num_draft_tokens < q_stats.num_accepted_draft_tokens / q_stats.num_draft_tokens
    statistic, dof = _chi_square(counts, _exact_joint(target, prompt, 3, temperature), NUM_SAMPLES)
    bound = chi2.ppf(1 - 1e-4, dof)
    assert statistic < bound, f"chi-square {statistic:.1f} >= {bound:.1f} ({dof} dof)"
    if kind == "draft_model":
        wrong, wrong_dof = _chi_square(counts, _exact_joint(draft, prompt, 3, temperature), NUM_SAMPLES)
        assert wrong > 3 * chi2.ppf(1 - 1e-4, wrong_dof)
    assert math.isfinite(statistic)
