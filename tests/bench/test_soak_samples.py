"""The soak's process sampler (bench/soak/samples.py): trends after the warm-up, processes that went away, bad
arguments; and one real sample of this test's own process group."""

from __future__ import annotations

import os
import types

import pytest

from bench.soak.bench import trend_problems
from bench.soak.command import chaos_plan
from bench.soak.samples import SELF_NAME, ProcessSample, Sample, Sampler, sample_processes, slope_per_min, trends, vanished
from pipeline.errors import SpecError


def _sample(t: float, **rss: float) -> Sample:
    return Sample(t, tuple(ProcessSample(name, pid, value, 10 + pid, 4) for pid, (name, value) in enumerate(rss.items())))


def test_a_warm_up_step_is_not_a_trend_and_a_steady_rise_is():
    step = [(t, 100.0 if t < 60 else 300.0) for t in range(0, 600, 30)]  # the first third holds the step
    rise = [(t, 100.0 + 2.5 * t / 60) for t in range(0, 600, 30)]
    assert slope_per_min(step) == 0.0
    assert slope_per_min(rise) == pytest.approx(2.5)
    assert slope_per_min([(0, 1.0), (30, 2.0)]) is None  # too few samples after the warm-up


def test_trends_name_every_process_and_a_bound_names_the_leaking_one():
    samples = [_sample(t, tritonserver=200.0, **{"stub tensorrt_llm_bls": 300.0 + t / 10}) for t in range(0, 900, 30)]
    found = {t.name: t for t in trends(samples)}
    assert found["tritonserver"].rss_slope_mb_per_min == 0.0
    assert found["stub tensorrt_llm_bls"].rss_slope_mb_per_min == pytest.approx(6.0)
    assert found["stub tensorrt_llm_bls"].fds_first == found["stub tensorrt_llm_bls"].fds_last == 11
    [problem] = trend_problems(list(found.values()), 0.5)
    assert problem.startswith("stub tensorrt_llm_bls RSS rose +6.00 MB/min after the warm-up")
    assert trend_problems(list(found.values()), None) == []


def test_a_process_that_went_away_mid_run_is_named_with_its_last_memory():
    samples = [_sample(0, tritonserver=200.0, **{"stub postprocessing": 900.0}), _sample(30, tritonserver=201.0, **{"stub postprocessing": 950.0})]
    samples.append(Sample(60, (samples[0].processes[0],)))
    [gone] = vanished(samples)
    assert gone == "stub postprocessing (pid 1) went away after 30 s at 950 MB RSS (a crash or the kernel's OOM killer: see dmesg)"


def test_the_sampler_samples_at_start_and_stop_and_in_between():
    ticks = iter(range(100))
    sampler = Sampler(lambda: (), 0.01, clock=lambda: float(next(ticks)))
    sampler.start()
    samples = sampler.stop()
    assert len(samples) >= 2 and samples[0].t_s < samples[-1].t_s
    with pytest.raises(ValueError, match="the sampling interval must be > 0 s, got 0"):
        Sampler(lambda: (), 0)


def test_a_real_sample_reads_this_process():
    [me] = [p for p in sample_processes(os.getpgid(0)) if p.name == SELF_NAME]
    assert me.pid == os.getpid() and me.rss_mb > 10 and me.fds and me.threads


def _args(**changes):
    values = dict(
        requests=None,
        duration=60.0,
        concurrency=4,
        cut_fraction=0.5,
        endpoints="grpc",
        max_tokens="4,8",
        seed=0,
        triton_models="ensemble",
        sample_interval=30.0,
        max_rss_slope=None,
    )
    return types.SimpleNamespace(**{**values, **changes})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sample_interval": 0.0}, "--sample-interval must be > 0 s, got 0"),
        ({"sample_interval": 120.0}, "--sample-interval 120 s is longer than --duration 60 s: no sample would fall inside the run"),
        ({"max_rss_slope": -1.0}, "--max-rss-slope must be >= 0 MB/min, got -1"),
        ({"duration": 0.0}, "bench soak: duration_s must be > 0, got 0"),
        ({"duration": -5.0}, "bench soak: duration_s must be > 0, got -5"),
    ],
)
def test_bad_soak_arguments_are_refused_before_anything_starts(changes, message):
    with pytest.raises(SpecError, match=message):
        chaos_plan(_args(**changes))
