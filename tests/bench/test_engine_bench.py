"""The engine benchmark: its seeded workload, and a quick run's report (shape and sanity, no timings)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from bench.engine.workload import FIRST_TOKEN_ID, geometric_length, make_prefix_workload, make_workload
from pipeline.stages.prepare import checkpoint_dir
from tests.conftest import BUILD_CONFIGS, DEFAULT_MODEL

VOCAB = 4096


def test_workload_is_deterministic_for_a_seed() -> None:
    first = make_workload(64, vocab_size=VOCAB, seed=7)
    assert make_workload(64, vocab_size=VOCAB, seed=7) == first
    other = make_workload(64, vocab_size=VOCAB, seed=8)
    assert other.prompts != first.prompts and other.output_lens != first.output_lens


def test_workload_lengths_follow_the_stated_distribution() -> None:
    workload = make_workload(4000, vocab_size=VOCAB, prompt_len=(16, 256), output_mean=64, output_cap=512, seed=0)
    prompt_lens = [len(p) for p in workload.prompts]
    assert min(prompt_lens) >= 16 and max(prompt_lens) <= 256
    assert min(prompt_lens) < 24 and max(prompt_lens) > 248  # uniform over the whole range
    assert all(FIRST_TOKEN_ID <= t < VOCAB for p in workload.prompts for t in p)
    assert min(workload.output_lens) >= 1 and max(workload.output_lens) <= 512
    assert 60 <= statistics.fmean(workload.output_lens) <= 68  # geometric, mean 64 (4000 draws)
    assert statistics.median(workload.output_lens) < 64  # long tail: median below the mean
    summary = workload.summary()
    assert summary["output_tokens"]["total"] == workload.num_output_tokens
    json.dumps(summary)


def test_output_cap_and_degenerate_mean() -> None:
    import random

    rng = random.Random(0)
    assert max(geometric_length(rng, 64, 10) for _ in range(500)) == 10
    assert {geometric_length(rng, 1, 10) for _ in range(50)} == {1}
    with pytest.raises(ValueError):
        geometric_length(rng, 0.5, 10)


def test_prefix_workload_shares_the_prefix_and_waves_cover_every_request() -> None:
    workload = make_prefix_workload(32, vocab_size=VOCAB, shared_prefix_len=200, wave_size=8, seed=0)
    assert len(workload.shared_prefix) == 200
    assert all(p[:200] == workload.shared_prefix and len(p) > 200 for p in workload.prompts)
    assert [len(w) for w in workload.waves] == [1, 8, 8, 8, 7]
    assert sorted(i for w in workload.waves for i in w) == list(range(32))
    assert make_prefix_workload(32, vocab_size=VOCAB, seed=0) == workload


# -- a quick run on the default model -----------------------------------------------------------


@pytest.fixture(scope="module")
def built_default(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(engine dir, HF model dir) of the default tiny-cpu config, built into a temporary store."""
    if not (DEFAULT_MODEL / "model.safetensors").exists():
        pytest.skip("default model not present")
    from rich.console import Console

    from pipeline.artifacts import ArtifactStore
    from pipeline.config.loader import load_config
    from pipeline.runner import run_pipeline

    root = tmp_path_factory.mktemp("bench")
    text = (BUILD_CONFIGS / "tiny-cpu.yaml").read_text().replace("../models/tiny-stdlib-llama", str(DEFAULT_MODEL))
    config = root / "tiny-cpu.yaml"
    config.write_text(text)
    loaded = load_config(config, ())
    results = {r.name: r for r in run_pipeline(loaded, ArtifactStore(root / "artifacts", loaded.spec.name), console=Console(quiet=True))}
    return results["build"].ref.path / "engine", checkpoint_dir(results["prepare"].ref.path)


@pytest.mark.slow
def test_quick_run_reports_every_section_with_sane_figures(built_default: tuple[Path, Path]) -> None:
    from bench.engine.bench import EngineBenchOptions, run_engine_bench
    from bench.engine.report import render_markdown

    engine_dir, hf_dir = built_default
    lines: list[str] = []
    result = run_engine_bench(engine_dir, hf_dir, EngineBenchOptions(quick=True), progress=lines.append)
    json.loads(json.dumps(result))  # JSON-serialisable as is
    assert lines

    systems = result["systems"]
    assert set(systems) == {"refengine_inflight", "refengine_static", "hf_static_generate", "hf_continuous_batching"}
    useful = result["workload"]["output_tokens"]["total"]
    for name, figures in systems.items():
        assert figures["useful_output_tokens"] == useful, name
        assert figures["all_requests_ran_their_length"], name
        assert figures["tokens_per_s"] > 0 and figures["wall_s"] > 0, name
        assert figures["tokens_per_s"] == pytest.approx(useful / figures["wall_s"], rel=0.01), name
    inflight, static = systems["refengine_inflight"], systems["refengine_static"]
    assert inflight["engine_steps"] > 0 and static["engine_steps"] >= inflight["engine_steps"]
    assert systems["hf_static_generate"]["generated_tokens_incl_padding_rows"] >= useful
    # (b) is true static batching: as many generated rows (padding included) as generate's (c).
    assert static["batching"] == "static" and inflight["batching"] == "inflight"
    assert static["generated_tokens_incl_padding_rows"] == systems["hf_static_generate"]["generated_tokens_incl_padding_rows"]
    assert inflight["generated_tokens_incl_padding_rows"] == useful
    same = result["agreement_with_refengine_inflight"]["refengine_static"]
    assert same["identical_outputs"] == same["requests"] == result["workload"]["num_requests"]

    ratios = result["ratios"]
    for key, other in (
        ("inflight_vs_static", "refengine_static"),
        ("inflight_vs_hf_static", "hf_static_generate"),
        ("inflight_vs_hf_continuous", "hf_continuous_batching"),
    ):
        assert ratios[key] == pytest.approx(inflight["tokens_per_s"] / systems[other]["tokens_per_s"], rel=0.01)
    assert result["targets"]["inflight_vs_static"]["value"] == ratios["inflight_vs_static"]
    assert result["targets"]["inflight_vs_hf_continuous"]["value"] == ratios["inflight_vs_hf_continuous"]

    kv = result["kv_utilisation"]
    assert 0 < kv["paged_mean"] <= 1 and 0 < kv["contiguous_mean"] <= 1
    assert kv["contiguous_mean"] < kv["paged_mean"]  # a max_seq_len reservation wastes more

    prefix = result["prefix_reuse"]
    assert prefix["off"]["prefill_tokens_from_cache"] == 0
    assert prefix["off"]["shared_prefill_skipped_fraction"] == 0
    assert prefix["on"]["prefill_tokens_from_cache"] > 0
    assert 0 < prefix["on"]["shared_prefill_skipped_fraction"] <= prefix["max_skippable_fraction"]
    assert prefix["on"]["prefill_tokens_computed"] < prefix["off"]["prefill_tokens_computed"]
    assert prefix["on"]["cache_hit_tokens_per_wave"][0] == 0  # the first wave computes the prefix

    assert set(result["targets"]) == {"inflight_vs_static", "inflight_vs_hf_continuous", "kv_paged_utilisation", "shared_prefill_skipped"}
    assert all(isinstance(t["met"], bool) for t in result["targets"].values())
    assert ratios["steps_static_over_inflight"] == pytest.approx(static["engine_steps"] / inflight["engine_steps"], rel=0.01)
    assert ratios["generated_rows_static_over_inflight"] == pytest.approx(static["generated_tokens_incl_padding_rows"] / useful, rel=0.01)

    table = render_markdown(result)
    assert "(a) refengine, inflight batching" in table and "(d) transformers continuous batching" in table


@pytest.mark.slow
def test_static_system_holds_each_batch_until_its_longest_request(built_default: tuple[Path, Path]) -> None:
    """(b): batches of B in arrival order, each running its longest request's length with every
    row computed; the same outputs as (a)."""
    import torch

    from bench.engine.systems import run_refengine
    from refengine import LLMEngine

    engine_dir, _ = built_default
    workload = make_workload(10, vocab_size=VOCAB, prompt_len=(16, 64), output_mean=8, output_cap=30, seed=3)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        inflight = run_refengine(LLMEngine.from_engine_dir(engine_dir, max_batch_size=4), workload)
        static = run_refengine(LLMEngine.from_engine_dir(engine_dir, max_batch_size=4, batching="static"), workload)
    finally:
        torch.set_num_threads(previous)
    assert static.outputs == inflight.outputs
    groups = [range(i, min(i + 4, 10)) for i in range(0, 10, 4)]
    longest = [max(workload.output_lens[i] for i in group) for group in groups]
    assert static.figures["engine_steps"] == sum(longest)  # every batch's prompts fit one step
    assert static.figures["generated_tokens_incl_padding_rows"] == sum(len(group) * n for group, n in zip(groups, longest))
    assert static.figures["useful_fraction_of_generated"] == pytest.approx(
        workload.num_output_tokens / static.figures["generated_tokens_incl_padding_rows"], abs=1e-4
    )
    assert inflight.figures["generated_tokens_incl_padding_rows"] == workload.num_output_tokens
    assert inflight.figures["engine_steps"] < static.figures["engine_steps"]


def test_speculative_bench_matches_plain_greedy_on_heldout_code(built_default: tuple[Path, Path], tmp_path: Path) -> None:
    """`bench speculative` on the default model and its shipped draft: every held-out prompt's greedy
    output is the plain engine's, token for token, for draft-target and n-gram speculation."""
    from bench.speculative.bench import SpeculativeBenchOptions, render_markdown, run_speculative_bench
    from bench.speculative.engines import draft_variant, ngram_variant
    from bench.speculative.prompts import heldout_code_prompts
    from pipeline.calibration import load_encoder

    engine_dir, hf_dir = built_default
    draft = DEFAULT_MODEL.parent / "tiny-stdlib-llama-draft"
    variants = {
        "plain": engine_dir,
        "draft_model": draft_variant(engine_dir, tmp_path, draft, 3),
        "ngram": ngram_variant(engine_dir, tmp_path, 3, 3),
    }
    encode, _ = load_encoder(hf_dir)
    prompts = heldout_code_prompts(encode, 1, 8, 48)
    options = SpeculativeBenchOptions(batch_sizes=(1, 8), max_tokens=24, max_draft_len=3, quick=True)
    result = run_speculative_bench(variants, prompts, options)
    for row in result["rows"]:
        for name in ("draft_model", "ngram"):
            assert row[name]["same_output_as_plain"], (row["batch_size"], name)
            assert 0 < row[name]["acceptance_rate"] < 1
    assert result["rows"][1]["requests"] == 8  # every held-out prompt at batch 8
    assert "draft_model speed-up" in render_markdown(result) and "draft_model CPU speed-up, median of rounds" in render_markdown(result)


def test_speculative_bench_reports_each_systems_best_round() -> None:
    from bench.speculative.bench import _best_of

    def run(cpu: float, wall: float, outputs: list[list[int]]) -> dict:
        return {"tokens_per_cpu_second": cpu, "tokens_per_second": wall, "seconds": 64 / wall, "outputs": outputs}

    best = _best_of([run(100.0, 90.0, [[1, 2]]), run(120.0, 80.0, [[1, 2]]), run(110.0, 95.0, [[1, 2]])])
    assert (best["tokens_per_cpu_second"], best["tokens_per_second"], best["rounds"], best["outputs_stable"]) == (120.0, 95.0, 3, True)
    assert not _best_of([run(1.0, 1.0, [[1]]), run(1.0, 1.0, [[2]])])["outputs_stable"]


def test_speculative_bench_pairs_each_round_with_the_same_rounds_plain_run() -> None:
    from bench.speculative.bench import _paired_cpu_speedups

    plain = [{"tokens_per_cpu_second": cpu} for cpu in (100.0, 80.0, 100.0)]  # round 2 ran under load
    speculative = [{"tokens_per_cpu_second": cpu} for cpu in (150.0, 96.0, 160.0)]
    assert _paired_cpu_speedups(speculative, plain) == {"cpu_speedup_per_round": [1.5, 1.2, 1.6], "cpu_speedup_median": 1.5}


def test_speculative_bench_with_medusa_heads_matches_plain_greedy(built_default: tuple[Path, Path], tmp_path: Path) -> None:
    """`bench speculative --medusa`: the Medusa variant of the built target (random heads of the model's sizes: greedy
    output cannot change), its per-node acceptance, and the CPU cost of verifying N tree nodes."""
    from bench.speculative.bench import SpeculativeBenchOptions, run_speculative_bench
    from bench.speculative.command import _render
    from bench.speculative.medusa import medusa_variant, verification_cost
    from bench.speculative.prompts import heldout_code_prompts
    from pipeline.calibration import load_encoder
    from refengine.speculative.medusa_files import write_random_medusa_heads

    engine_dir, hf_dir = built_default
    heads = write_random_medusa_heads(tmp_path / "heads", 4, 1, 256, 4096, medusa_choices=[[0], [1], [2], [0, 0], [1, 0], [0, 0, 0]])
    tree = "{0}, {1}, {2}, {3}, {0, 0}, {0, 1}"
    variants = {
        "plain": engine_dir,
        "medusa": medusa_variant(engine_dir, tmp_path, heads, tree),
        "medusa_vocab1024": medusa_variant(engine_dir, tmp_path, heads, tree, 1024, "medusa_vocab1024"),
    }
    encode, _ = load_encoder(hf_dir)
    options = SpeculativeBenchOptions(batch_sizes=(1, 4), max_tokens=16, quick=True)
    result = run_speculative_bench(variants, heldout_code_prompts(encode, 1, 8, 48), options)
    for row in result["rows"]:
        for name in ("medusa", "medusa_vocab1024"):
            assert row[name]["same_output_as_plain"] and row[name]["draft_tokens"] > 0
            assert row[name]["accepted_per_tree_step"] >= 0
    result["medusa_verification_cost"] = cost = verification_cost(variants["medusa"], True, quick=True)
    assert [row["nodes"] for row in cost["nodes"]] == [0, 4, 16] and len(cost["heads"]) == 3
    assert "one target forward verifying N tree nodes" in _render(result) and "medusa_vocab1024 at batch 4" in _render(result)
