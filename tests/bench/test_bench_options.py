"""The benchmarks' options records: defaults, `quick`, validation, and the recipe's `call` line,
which stays as BENCHMARKS.md quotes it."""

from __future__ import annotations

import pytest

from bench.engine.bench import EngineBenchOptions
from bench.overhead.recipe import _call
from bench.overhead.records import OverheadOptions
from tests.conftest import REPO


def test_the_default_calls_are_the_ones_benchmarks_md_records():
    recorded = (REPO / "BENCHMARKS.md").read_text()
    assert f"Recipe: `{EngineBenchOptions().resolved().call()}`" in recorded
    assert f"Recipe: `{_call(OverheadOptions())}`" in recorded


def test_quick_shrinks_the_engine_workload_and_runs_one_round():
    quick = EngineBenchOptions(quick=True, num_requests=128).resolved()
    assert (quick.num_requests, quick.prompt_len, quick.output_mean, quick.output_cap, quick.rounds) == (16, (16, 64), 12, 48, 1)
    assert quick.engine_overrides == {"max_batch_size": 4} and (quick.prefix_requests, quick.prefix_wave_size) == (8, 4)
    full = EngineBenchOptions(prompt_len=[8, 32], rounds=3).resolved()
    assert (full.prompt_len, full.rounds, full.engine_overrides, full.prefix_requests) == ((8, 32), 3, {}, 32)


@pytest.mark.parametrize("field", [{"concurrency": 0}, {"requests": 0}, {"stream_requests": 0}, {"stream_tokens": 1}])
def test_overhead_options_refuse_what_cannot_be_measured(field):
    with pytest.raises(ValueError, match="must be >= 1, stream_tokens >= 2"):
        OverheadOptions(**field)
