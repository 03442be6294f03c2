"""Medusa on refengine: heads propose a tree, the target verifies it in one forward with a tree attention mask.

Greedy output equals plain greedy decoding for any heads (random ones, and heads close to the target's own lm_head,
which are often right, so that deep and non-first branches are accepted and their K/V moved into place); the KV blocks
of rejected branches are released; bad trees and heads are refused by name."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from refengine import EngineConfig, EngineConfigError, InvalidRequestError, LLMEngine, SamplingParams, load_checkpoint
from refengine.model_runner import load_model
from refengine.speculative.medusa_files import write_medusa_engine, write_random_medusa_heads
from refengine.speculative.medusa_heads import HEADS_FILE, MedusaHeads
from refengine.speculative.medusa_planner import MedusaDrafter
from refengine.speculative.medusa_tree import check_medusa_choices, format_medusa_choices, medusa_tree, parse_medusa_choices

VOCAB, HIDDEN, HEADS = 48, 32, 3
CONFIG = EngineConfig(max_batch_size=6, max_input_len=48, max_seq_len=96, max_num_tokens=96, tokens_per_block=4)
PROMPTS = [[1, 5, 9, 5, 9, 5, 9, 5], [3, 4, 5, 6, 7, 3, 4, 5], [10, 20, 30], [7] * 12, [2, 40, 17, 2, 40, 17, 2, 40], list(range(1, 30))]
CHAIN = ((0,), (0, 0), (0, 0, 0))
WIDE = tuple((i,) for i in range(8))
MC_LIKE = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 2), (2, 0), (0, 0, 1))
TREES = {"chain": CHAIN, "wide": WIDE, "mc-like": MC_LIKE}


@pytest.fixture(scope="module")
def setup(tmp_path_factory, checkpoint_writer):
    root = tmp_path_factory.mktemp("medusa")
    target_dir = checkpoint_writer(root / "target", seed=3, vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2)
    model = load_model(load_checkpoint(target_dir))
    random_heads = write_random_medusa_heads(root / "random-heads", HEADS, 1, HIDDEN, VOCAB, seed=5, medusa_choices=MC_LIKE)
    return {"root": root, "target_dir": target_dir, "model": model, "random": random_heads, "close": _close_heads(root / "close-heads", target_dir)}


def _close_heads(directory: Path, target_dir: Path, hidden: int = HIDDEN, vocab: int = VOCAB) -> Path:
    """Heads whose projection is the target's lm_head plus noise and whose residual layers are near zero: on a tiny
    random model's repetitive text they guess the next tokens often, not always."""
    write_random_medusa_heads(directory, HEADS, 1, hidden, vocab, seed=6, scale=0.01)
    lm_head = load_file(str(target_dir / "rank0.safetensors"))["lm_head.weight"].float()
    tensors = load_file(str(directory / HEADS_FILE))
    generator = torch.Generator().manual_seed(8)
    for head in range(HEADS):
        noise = 0.3 * lm_head.std() * torch.randn(lm_head.shape, generator=generator)
        tensors[f"{head}.1.weight"] = (lm_head + noise).half()
    save_file(tensors, str(directory / HEADS_FILE))
    return directory


def _drafter(setup, heads: str, choices, max_draft_len: int = 16) -> MedusaDrafter:
    loaded = MedusaHeads.load(setup[heads] / HEADS_FILE, HEADS, 1, HIDDEN, VOCAB, torch.float32, "medusa_heads")
    return MedusaDrafter(loaded, choices, max_draft_len)


def _tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


PREEMPTING = {"scheduler_policy": "max_utilization", "num_kv_blocks": 14}
CHUNKED_PREFIX = {"enable_chunked_context": True, "max_num_tokens": 7, "enable_prefix_caching": True}


@pytest.mark.parametrize("heads", ["random", "close"])
@pytest.mark.parametrize("tree", sorted(TREES))
@pytest.mark.parametrize("changes", [{}, PREEMPTING, CHUNKED_PREFIX], ids=["default", "preempting", "chunked+prefix"])
def test_greedy_medusa_equals_plain_greedy(setup, heads, tree, changes):
    config = CONFIG.replace(**changes)
    params = [
        SamplingParams(max_tokens=m, temperature=0, stop_token_ids=stop, end_id=end)
        for m, stop, end in itertools.islice(itertools.cycle([(20, (), None), (9, ((5, 9),), None), (17, (), 3)]), len(PROMPTS))
    ]
    plain = LLMEngine(setup["model"], config).generate(PROMPTS, params)
    engine = LLMEngine(setup["model"], config.replace(max_draft_len=16), _drafter(setup, heads, TREES[tree]))
    free_before = engine.scheduler.kv_cache.num_free_blocks
    medusa = engine.generate(PROMPTS, params)
    assert _tokens(medusa) == _tokens(plain)
    assert [o.outputs[0].finish_reason for o in medusa] == [o.outputs[0].finish_reason for o in plain]
    stats = engine.stats()
    assert stats.num_tree_steps > 0 and stats.num_draft_tokens > 0
    if heads == "close":  # deep and non-first branches were accepted (their K/V moved into place)
        assert stats.num_accepted_draft_tokens > 0.1 * stats.num_draft_tokens / len(TREES[tree])
        assert max(len(path) for path, _ in stats.tree_node_acceptances) > 1 or tree == "wide"
        if tree != "chain":
            assert any(path[-1] > 0 for path, _ in stats.tree_node_acceptances)
    assert sum(count for _, count in stats.tree_node_acceptances) == stats.num_accepted_draft_tokens
    if changes is PREEMPTING:
        assert engine.scheduler.num_preemptions > 0
    # the rejected branches' slots were given back: nothing held once every request ended
    assert engine.scheduler.kv_cache.num_free_blocks == free_before
    assert engine.kv_cache_usage().num_used_blocks == 0


def test_medusa_and_plain_requests_share_steps(setup):
    """A batch mixing Medusa sequences (the engine's tree, a request's own) and sequences that turn speculation off."""
    params = [
        SamplingParams(max_tokens=15, temperature=0, medusa_choices="{0}, {1}, {0, 0}" if i % 3 == 1 else None, num_draft_tokens=0 if i % 3 == 2 else None)
        for i in range(len(PROMPTS))
    ]
    plain = LLMEngine(setup["model"], CONFIG).generate(PROMPTS, SamplingParams(max_tokens=15, temperature=0))
    engine = LLMEngine(setup["model"], CONFIG.replace(max_draft_len=16), _drafter(setup, "close", MC_LIKE))
    outputs = engine.generate(PROMPTS, params)
    assert _tokens(outputs) == _tokens(plain)
    drafted = [o.metrics.total_draft_tokens for o in outputs]
    assert all(d == 0 for d in drafted[2::3]) and all(d > 0 for d in drafted[0::3])
    assert {len(path) for path, _ in engine.stats().tree_node_acceptances} >= {1, 2, 3}
    # a request's tree deeper than the engine's: the heads propose for the deepest tree of the step
    wide = LLMEngine(setup["model"], CONFIG.replace(max_draft_len=16), _drafter(setup, "close", WIDE))
    deep = wide.generate(PROMPTS, [SamplingParams(max_tokens=15, temperature=0, medusa_choices=CHAIN if i % 2 else None) for i in range(len(PROMPTS))])
    assert _tokens(deep) == _tokens(plain)
    assert max(len(path) for path, _ in wide.stats().tree_node_acceptances) == 3


# -- the tree's syntax and checks --------------------------------------------------------------
def test_choices_parse_check_and_format():
    assert parse_medusa_choices("{0}, {0, 0}, {1}, {0, 1}") == ((0,), (0, 0), (1,), (0, 1))
    assert parse_medusa_choices("{0},{0,0}") == ((0,), (0, 0))
    choices = check_medusa_choices([[0, 1], [1], [0], [0, 0]], 2, 4, "where")
    assert choices == ((0,), (1,), (0, 0), (0, 1))
    assert format_medusa_choices(choices) == "{0}, {1}, {0, 0}, {0, 1}"
    tree = medusa_tree(choices)
    assert tree.parents == (-1, -1, 0, 0) and tree.depths == (1, 1, 2, 2) and tree.top_k == (2, 2)
    assert tree.node_tokens([[7, 8], [9, 10]]) == (7, 8, 9, 10)
    assert tree.cut(3, 5).paths == ((0,), (1,), (0, 0)) and tree.cut(9, 1).paths == ((0,), (1,))


@pytest.mark.parametrize(
    "choices, match",
    [
        ("{0}, {0, 0", "not a list of paths"),
        ("[[0]]", "not a list of paths"),
        ([[0], [0, 0], [0, 0, 0]], "3 deep; the engine has 2"),
        ([[0, 0]], "needs its prefix"),
        ([[0], [0]], "more than once"),
        ([[i] for i in range(5)], "exceed max_draft_len 4"),
        ([[0, -1]], "not a non-negative int"),
    ],
)
def test_bad_choices_are_refused_by_name(choices, match):
    with pytest.raises(ValueError, match=f"where: .*{match}"):
        check_medusa_choices(parse_medusa_choices(choices, "where") if isinstance(choices, str) else choices, 2, 4, "where")


def test_requests_a_medusa_engine_refuses_by_name(setup):
    engine = LLMEngine(setup["model"], CONFIG.replace(max_draft_len=4, max_beam_width=2), _drafter(setup, "random", CHAIN, 4))
    for params, field in [
        (SamplingParams(beam_width=2, temperature=0), "beam_width"),
        (SamplingParams(num_draft_tokens=2), "num_draft_tokens"),
        (SamplingParams(use_draft_logits=True), "use_draft_logits"),
        (SamplingParams(medusa_choices="{0}, {0, 0}, {0, 0, 0}, {0, 0, 0, 0}"), "medusa_choices"),
        (SamplingParams(medusa_choices="{0}, {1}, {2}, {3}, {4}"), "medusa_choices"),
        (SamplingParams(medusa_choices="{x}"), "medusa_choices"),
    ]:
        with pytest.raises(InvalidRequestError) as error:
            engine.add_request([1, 2], params)
        assert error.value.field == field
    with pytest.raises(InvalidRequestError, match="medusa_choices"):
        LLMEngine(setup["model"], CONFIG).add_request([1, 2], SamplingParams(medusa_choices="{0}"))


# -- the engine directory ---------------------------------------------------------------------
def _engine_dir(setup, heads="close", choices=MC_LIKE, **kwargs) -> Path:
    from refengine import write_engine_dir

    build = {"max_batch_size": 4, "max_input_len": 48, "max_seq_len": 96, "max_num_tokens": 96, "plugin_config": {"tokens_per_block": 4}}
    engine_dir = write_engine_dir(setup["target_dir"], setup["root"] / f"engine-{next(_NUMBERS)}", build, "test")
    write_medusa_engine(engine_dir, setup[heads], choices, **kwargs)
    return engine_dir


_NUMBERS = itertools.count()


def test_engine_directory_with_medusa_heads_loads_and_speculates(setup):
    engine_dir = _engine_dir(setup)
    config = json.loads((engine_dir / "config.json").read_text())
    assert config["build_config"]["speculative_decoding_mode"] == 4 and config["build_config"]["max_draft_len"] == len(MC_LIKE)
    engine = LLMEngine.from_engine_dir(engine_dir)
    assert engine.num_medusa_heads == HEADS and LLMEngine(setup["model"], CONFIG).num_medusa_heads == 0
    plain = LLMEngine(setup["model"], CONFIG).generate(PROMPTS[:3], SamplingParams(max_tokens=12, temperature=0))
    assert _tokens(engine.generate(PROMPTS[:3], SamplingParams(max_tokens=12, temperature=0))) == _tokens(plain)
    assert engine.stats().num_accepted_draft_tokens > 0
    assert LLMEngine.from_engine_dir(engine_dir, medusa_choices="")._speculator.drafter.tree.num_nodes == len(MC_LIKE)  # empty: the engine's
    assert SamplingParams(medusa_choices=" ").medusa_choices is None
    chain = LLMEngine.from_engine_dir(engine_dir, medusa_choices="{0}, {0, 0}")  # Triton's parameter overrides the tree
    assert _tokens(chain.generate(PROMPTS[:3], SamplingParams(max_tokens=12, temperature=0))) == _tokens(plain)
    assert {len(path) for path, _ in chain.stats().tree_node_acceptances} <= {1, 2}
    with pytest.raises(EngineConfigError, match="medusa_choices: .*4 deep; the engine has 3"):
        LLMEngine.from_engine_dir(engine_dir, medusa_choices="{0}, {0, 0}, {0, 0, 0}, {0, 0, 0, 0}")
    with pytest.raises(EngineConfigError, match="medusa_choices: .*exceed max_draft_len"):
        LLMEngine.from_engine_dir(engine_dir, medusa_choices=format_medusa_choices([(i,) for i in range(11)]))


def _edit(engine_dir: Path, change) -> None:
    config = json.loads((engine_dir / "config.json").read_text())
    change(config)
    (engine_dir / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda c: c["refengine_speculative"].update(medusa_heads="nowhere.safetensors"), "refengine_speculative.medusa_heads"),
        (lambda c: c["refengine_speculative"].update(num_medusa_heads=0), "refengine_speculative.num_medusa_heads"),
        (lambda c: c["refengine_speculative"].update(num_medusa_layers="1"), "refengine_speculative.num_medusa_layers"),
        (lambda c: c["refengine_speculative"].update(num_medusa_layers=2), "refengine_speculative.medusa_heads"),
        (lambda c: c["refengine_speculative"].update(num_medusa_heads=4), "refengine_speculative.medusa_heads"),
        (lambda c: c["refengine_speculative"].update(medusa_choices=[[0, 0]]), "refengine_speculative.medusa_choices"),
        (lambda c: c["refengine_speculative"].update(medusa_choices=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]), "refengine_speculative.medusa_choices"),
        (lambda c: c["build_config"].update(speculative_decoding_mode=2), "build_config.speculative_decoding_mode"),
        (lambda c: c["build_config"].update(max_draft_len=5), "refengine_speculative.max_draft_len"),
    ],
)
def test_bad_medusa_settings_are_refused_by_field(setup, edit, field):
    engine_dir = _engine_dir(setup)
    _edit(engine_dir, edit)
    with pytest.raises(EngineConfigError) as error:
        LLMEngine.from_engine_dir(engine_dir)
    assert error.value.field == field


def test_heads_that_do_not_fit_the_model_are_refused_naming_both_sizes(setup):
    wrong_hidden = write_random_medusa_heads(setup["root"] / "wide-heads", HEADS, 1, HIDDEN * 2, VOCAB, medusa_choices=CHAIN)
    with pytest.raises(EngineConfigError, match=f"0.0.linear.weight has shape \\[64, 64\\].*hidden size 64 vs the model's {HIDDEN}"):
        LLMEngine.from_engine_dir(_engine_dir(setup, "wide", CHAIN) if setup.setdefault("wide", wrong_hidden) else None)
    wrong_vocab = write_random_medusa_heads(setup["root"] / "vocab-heads", HEADS, 1, HIDDEN, VOCAB + 1, medusa_choices=CHAIN)
    with pytest.raises(EngineConfigError, match=f"vocab size {VOCAB + 1} vs the model's {VOCAB}"):
        LLMEngine.from_engine_dir(_engine_dir(setup, "vocab", CHAIN) if setup.setdefault("vocab", wrong_vocab) else None)


def test_greedy_medusa_with_logit_processors_and_logprobs_equals_plain(setup):
    """Each row is processed as the sampler processes it (penalties over the history plus the node's ancestors,
    bias, bad words, min_tokens): accepted tokens and their logprobs are plain greedy's."""
    params = [
        SamplingParams(max_tokens=16, temperature=0, repetition_penalty=1.4, logprobs=2),
        SamplingParams(max_tokens=16, temperature=0, logit_bias=((11, 2.0),), bad_words=((25, 25),), frequency_penalty=0.3),
        SamplingParams(max_tokens=16, temperature=0, end_id=0, min_tokens=8, presence_penalty=0.5),
    ] * 2
    plain = LLMEngine(setup["model"], CONFIG).generate(PROMPTS, params)
    engine = LLMEngine(setup["model"], CONFIG.replace(max_draft_len=16), _drafter(setup, "close", MC_LIKE))
    medusa = engine.generate(PROMPTS, params)
    assert _tokens(medusa) == _tokens(plain)
    for ours, theirs in zip(medusa, plain):
        ours_logprobs, theirs_logprobs = ours.outputs[0].logprobs or (), theirs.outputs[0].logprobs or ()
        assert [t.logprob for t in ours_logprobs] == pytest.approx([t.logprob for t in theirs_logprobs], abs=1e-5)
        assert [[i for i, _ in t.top_logprobs] for t in ours_logprobs] == [[i for i, _ in t.top_logprobs] for t in theirs_logprobs]
    assert engine.stats().num_accepted_draft_tokens > 0


# -- the sampling distribution ------------------------------------------------------------------
SAMPLE_VOCAB, SAMPLE_HIDDEN, NUM_SAMPLES = 6, 16, 500


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_medusa_is_distributed_as_the_target(tmp_path, checkpoint_writer, tensor_rewriter, temperature):
    """Chi-square goodness of fit of the first 3 sampled tokens against the target's exact joint distribution (as the
    draft path's test: bound at the 1 - 1e-4 quantile). The tree has several children per node, so first, later and
    no candidates are accepted: every branch of the multi-candidate acceptance runs."""
    from scipy.stats import chi2

    from tests.refengine.test_speculative_decoding import _chi_square, _exact_joint

    target_dir = checkpoint_writer(tmp_path / "t", seed=21, vocab_size=SAMPLE_VOCAB, hidden_size=SAMPLE_HIDDEN, intermediate_size=24, num_hidden_layers=1)
    tensor_rewriter(target_dir, lambda tensors: tensors.update({"lm_head.weight": tensors["lm_head.weight"] * 6}))
    target = load_model(load_checkpoint(target_dir))
    heads_dir = write_random_medusa_heads(tmp_path / "heads", 2, 1, SAMPLE_HIDDEN, SAMPLE_VOCAB, seed=4, scale=0.3)
    heads = MedusaHeads.load(heads_dir / HEADS_FILE, 2, 1, SAMPLE_HIDDEN, SAMPLE_VOCAB, torch.float32, "medusa_heads")
    tree = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0))
    config = EngineConfig(
        max_batch_size=100, max_input_len=32, max_seq_len=48, max_num_tokens=2048, tokens_per_block=4, max_draft_len=6, scheduler_policy="max_utilization"
    )
    engine = LLMEngine(target, config, MedusaDrafter(heads, tree, 6))
    prompt = [4, 0, 5]
    outputs = engine.generate([prompt] * NUM_SAMPLES, [SamplingParams(max_tokens=3, temperature=temperature, seed=i) for i in range(NUM_SAMPLES)])
    counts: dict[tuple[int, ...], int] = {}
    for output in outputs:
        cell = tuple(output.outputs[0].token_ids)
        counts[cell] = counts.get(cell, 0) + 1
    stats = engine.stats()
    assert 0 < stats.num_accepted_draft_tokens < stats.num_tree_steps * 2  # accepted and rejected
    accepted_ranks = {path[-1] for path, _ in stats.tree_node_acceptances}
    assert {0, 1} <= accepted_ranks  # a first candidate and a later one (after the first was rejected)
    statistic, dof = _chi_square(counts, _exact_joint(target, prompt, 3, temperature), NUM_SAMPLES)
    bound = chi2.ppf(1 - 1e-4, dof)
    assert statistic < bound, f"chi-square {statistic:.1f} >= {bound:.1f} ({dof} dof)"
    # Power: the same counts against the target at another temperature fail by far.
    wrong, wrong_dof = _chi_square(counts, _exact_joint(target, prompt, 3, temperature * 1.6), NUM_SAMPLES)
    assert wrong > 2 * chi2.ppf(1 - 1e-4, wrong_dof)


# -- guided decoding ---------------------------------------------------------------------------
def test_greedy_guided_medusa_equals_greedy_guided_decoding(tmp_path, checkpoint_writer):
    """A node the grammar refuses (given its ancestors) is pruned with its subtree; every kept node's row is masked."""
    import tests.refengine.test_guided_speculative as guided

    target_dir = checkpoint_writer(tmp_path / "target", vocab_size=guided.VOCAB_SIZE)
    target = load_model(load_checkpoint(target_dir))
    heads_dir = _close_heads(tmp_path / "heads", target_dir, vocab=guided.VOCAB_SIZE)
    heads = MedusaHeads.load(heads_dir / HEADS_FILE, HEADS, 1, HIDDEN, guided.VOCAB_SIZE, torch.float32, "medusa_heads")
    plain = LLMEngine(target, guided.CONFIG)
    plain.enable_guided_decoding(guided._info())
    engine = LLMEngine(target, guided.CONFIG.replace(max_draft_len=16), MedusaDrafter(heads, MC_LIKE, 16))
    engine.enable_guided_decoding(guided._info())
    params = guided._params()
    expected = plain.generate(guided.PROMPTS * 2, params)
    outputs = engine.generate(guided.PROMPTS * 2, params)
    assert _tokens(outputs) == _tokens(expected)
    guided._check_valid(outputs)
    stats = engine.stats()
    assert stats.num_tree_steps > 0 and stats.num_accepted_draft_tokens > 0
    assert stats.num_draft_tokens < stats.num_tree_steps * len(MC_LIKE)  # nodes were pruned
    assert engine.kv_cache_usage().num_used_blocks == 0
    sampled = engine.generate(guided.PROMPTS * 2, guided._params(temperature=1.0, seed=7))
    guided._check_valid(sampled)  # sampled: every emitted token is one the grammar allows


def test_the_grammar_prunes_refused_nodes_with_their_subtrees(tmp_path, checkpoint_writer):
    import tests.refengine.test_guided_speculative as guided
    from refengine.speculative.medusa_planner import _within_grammar

    engine = LLMEngine(load_model(load_checkpoint(checkpoint_writer(tmp_path / "t", vocab_size=guided.VOCAB_SIZE))), guided.CONFIG)
    engine.enable_guided_decoding(guided._info())
    state = engine.guided_decoder.new_state(guided.GuidedDecodingParams("regex", "ab[0-9]"))
    a, b, seven, z = (guided.VOCAB.index(c) for c in "ab7z")
    tree = medusa_tree(((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))  # tokens: a, z, b, z, b, 7
    kept, masks = _within_grammar(tree, (a, z, b, z, b, seven), state)
    assert kept == [0, 2, 5]  # z refused (and its child), a -> z refused, a -> b -> 7 kept
    assert masks.shape == (3, guided.VOCAB_SIZE) and bool(masks[0][b]) and bool(masks[1][seven]) and not bool(masks[1][z])
    assert state.accepts(a) and not state.accepts(b)  # rolled back: still at the start


def test_n_samples_streaming_and_stream_interval(setup):
    """n > 1: the first step draws the samples (not drafted), each forked sample is drafted from its next step on;
    a streamed response carries every token a step accepted; stream_interval counts steps as without Medusa."""
    drafter = _drafter(setup, "close", MC_LIKE)
    engine = LLMEngine(setup["model"], CONFIG.replace(max_draft_len=16), drafter)
    [output] = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=14, temperature=0, n=3))
    [plain] = LLMEngine(setup["model"], CONFIG).generate([PROMPTS[0]], SamplingParams(max_tokens=14, temperature=0, n=3))
    assert [c.token_ids for c in output.outputs] == [c.token_ids for c in plain.outputs]
    assert engine.stats().num_tree_steps >= 3
    streamed = list(LLMEngine(setup["model"], CONFIG.replace(max_draft_len=16), drafter).stream(PROMPTS[3], SamplingParams(max_tokens=16, temperature=0)))
    sizes = [len(o.outputs[0].new_token_ids) for o in streamed]
    assert sum(sizes) == 16 and max(sizes) > 1
    every_other = list(
        LLMEngine(setup["model"], CONFIG.replace(max_draft_len=16, stream_interval=2), drafter).stream(PROMPTS[3], SamplingParams(max_tokens=16, temperature=0))
    )
    assert len(every_other) < len(streamed) and every_other[-1].outputs[0].token_ids == streamed[-1].outputs[0].token_ids


def test_tree_verification_cost_is_measured_per_node_count(setup):
    from refengine.speculative.medusa_cost import benchmark_tree, measure_heads, measure_tree_verification

    assert benchmark_tree(12)[:11] == tuple((i,) for i in range(10)) + ((0, 0),) and len(benchmark_tree(64)) == 64
    check_medusa_choices(benchmark_tree(64), 4, 64, "benchmark tree")  # prefix-closed, 4 deep at most
    rows = measure_tree_verification(setup["model"], [0, 3, 9], context_len=10, repeats=2, tokens_per_block=4)
    assert [row["nodes"] for row in rows] == [0, 3, 9] and rows[0]["relative_cost"] == 1.0
    assert all(row["wall_ms"] > 0 and row["cpu_ms"] >= 0 for row in rows)
    heads = MedusaHeads.load(setup["random"] / HEADS_FILE, HEADS, 1, HIDDEN, VOCAB, torch.float32, "medusa_heads")
    assert measure_heads(heads, HIDDEN, (3, 2), batch_size=4, repeats=2)["wall_ms"] > 0


@pytest.mark.parametrize("name", ["gemma2_windowed", "gemma3_text"])
def test_greedy_medusa_on_sliding_window_models_equals_transformers(tmp_path, name):
    """A tree row's window is measured from its position (root + depth), not from its slot: Gemma 2 / 3 with 16-token
    windows and prompts past them answer what transformers answers; heads near the model's lm_head make deep accepts."""
    from tests.refengine.conftest import hf_greedy
    from tests.support.gemma_fixtures import build_gemma_model, build_gemma_models

    model = build_gemma_models(tmp_path)[name] if name == "gemma2_windowed" else build_gemma_model(name, tmp_path)
    target = load_model(load_checkpoint(model.checkpoint_dir))
    hidden = target.config.hidden_size
    lm_head = target._logits.weight.float()
    generator = torch.Generator().manual_seed(1)
    projections = [lm_head + 0.3 * lm_head.std() * torch.randn(lm_head.shape, generator=generator) for _ in range(HEADS)]
    heads = MedusaHeads([[(torch.zeros(hidden, hidden), torch.zeros(hidden))] for _ in range(HEADS)], projections)
    engine = LLMEngine(target, EngineConfig(tokens_per_block=4, max_num_tokens=128, max_batch_size=4, max_draft_len=16), MedusaDrafter(heads, MC_LIKE, 16))
    prompts = [[7, 8, 9, 10] * 6, [(5 * i) % 60 + 3 for i in range(41)]]
    outputs = engine.generate(prompts, SamplingParams(max_tokens=24, temperature=0))
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == hf_greedy(model.hf_model, prompt, 24)
    assert max((len(path) for path, _ in engine.stats().tree_node_acceptances), default=0) >= 2


@pytest.mark.parametrize("policy", ["guaranteed_no_evict", "max_utilization"])
def test_a_tree_is_cut_to_the_blocks_free_and_gives_them_back(setup, policy):
    """A KV pool exactly as large as the requests: trees get only the slots left (cut, deepest nodes first), the
    rejected branches' blocks come back in the same step, nothing leaks, and no admitted request is preempted for a tree."""
    config = CONFIG.replace(num_kv_blocks=12, scheduler_policy=policy, max_draft_len=16)
    prompts = [PROMPTS[0], PROMPTS[3][:8]]  # 8 + 16 tokens each: 6 blocks of 4 each, 12 in all
    params = SamplingParams(max_tokens=16, temperature=0)
    plain = LLMEngine(setup["model"], config.replace(max_draft_len=0)).generate(prompts, params)
    engine = LLMEngine(setup["model"], config, _drafter(setup, "close", MC_LIKE))
    assert _tokens(engine.generate(prompts, params)) == _tokens(plain)
    stats = engine.stats()
    assert stats.num_tree_steps > 0 and stats.num_draft_tokens < stats.num_tree_steps * len(MC_LIKE)  # trees were cut
    assert engine.scheduler.num_preemptions == 0
    assert engine.scheduler.kv_cache.num_free_blocks == 12


@pytest.mark.parametrize("algo", ["FP8", "INT8"])
def test_greedy_medusa_on_a_quantized_kv_cache_equals_plain(tmp_path, checkpoint_writer, tensor_rewriter, algo):
    """The accepted nodes' K/V codes move as bytes (float8 has no CPU index_copy): greedy output is plain greedy's on the
    same quantized cache."""
    target_dir = checkpoint_writer(
        tmp_path / "t", seed=3, vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, quantization={"quant_algo": None, "kv_cache_quant_algo": algo}
    )
    tensor_rewriter(
        target_dir, lambda tensors: tensors.update({f"transformer.layers.{i}.attention.kv_cache_scaling_factor": torch.tensor([0.05]) for i in range(2)})
    )
    model = load_model(load_checkpoint(target_dir))
    assert model.kv_cache_dtype == (torch.float8_e4m3fn if algo == "FP8" else torch.int8)
    heads = MedusaHeads.load(_close_heads(tmp_path / "heads", target_dir) / HEADS_FILE, HEADS, 1, HIDDEN, VOCAB, torch.float32, "h")
    params = SamplingParams(max_tokens=20, temperature=0)
    plain = LLMEngine(model, CONFIG).generate(PROMPTS, params)
    engine = LLMEngine(model, CONFIG.replace(max_draft_len=16), MedusaDrafter(heads, MC_LIKE, 16))
    assert _tokens(engine.generate(PROMPTS, params)) == _tokens(plain)
    assert any(path[-1] > 0 or len(path) > 1 for path, _ in engine.stats().tree_node_acceptances)  # K/V were moved
