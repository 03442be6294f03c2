"""Priority scheduling: admission by priority, preemption for a higher priority, the starvation guard and
shortest_uncached_first. The scheduler tests drive `FakeRunner` (test_refengine_scheduler.py), which checks every
block table against the tokens; the engine tests run a small random model and compare greedy tokens."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings

from refengine import EngineConfig, EngineConfigError, InvalidRequestError, LLMEngine, SamplingParams
from refengine.priority import DEFAULT_PRIORITY
from refengine.scheduler import Scheduler
from tests.refengine.test_refengine_scheduler import FakeRunner, workloads

LOW, HIGH = 0.2, 0.9
GREEDY = SamplingParams(max_tokens=12, temperature=0)


def _config(**changes):
    values = dict(max_batch_size=4, max_num_tokens=64, tokens_per_block=4, num_kv_blocks=32, max_input_len=32, max_seq_len=64)
    values.update(changes)
    return EngineConfig(**values)


def _step(scheduler, runner):
    """One step; returns (scheduled seq ids, preempted seq ids, requests finished in it)."""
    output = scheduler.schedule()
    updates = scheduler.update_from_output(output, runner.execute(output))
    finished = [u.request_id for u in updates if u.finish_reason is not None]
    return [item.seq_id for item in output.scheduled], list(output.preempted_seq_ids), finished


def _run_to_end(scheduler, runner, limit=500):
    finish_order = []
    for _ in range(limit):
        if not scheduler.has_unfinished():
            return finish_order
        finish_order += _step(scheduler, runner)[2]
    raise AssertionError("the scheduler did not finish")


# -- the order ---------------------------------------------------------------------------------------------------------
def test_a_high_priority_request_queued_behind_low_ones_is_admitted_first():
    scheduler = Scheduler(_config(max_batch_size=1))
    runner = FakeRunner(scheduler, 4, seed=0)
    scheduler.add_request("low-a", [1] * 5, SamplingParams(max_tokens=2), 0, priority=LOW)
    scheduler.add_request("low-b", [2] * 5, SamplingParams(max_tokens=2), 0, priority=LOW)
    scheduler.add_request("high", [3] * 5, SamplingParams(max_tokens=2), 0, priority=HIGH)
    scheduler.add_request("default", [4] * 5, SamplingParams(max_tokens=2), 0)
    assert _run_to_end(scheduler, runner) == ["high", "default", "low-a", "low-b"]


def test_equal_priorities_are_first_come_first_served():
    scheduler = Scheduler(_config(max_batch_size=1))
    runner = FakeRunner(scheduler, 4, seed=0)
    for index in range(4):
        scheduler.add_request(f"r{index}", [index + 1] * (8 - index), SamplingParams(max_tokens=2), 0, priority=LOW)
    assert _run_to_end(scheduler, runner) == ["r0", "r1", "r2", "r3"]


def test_blocks_running_out_preempt_the_lowest_priority_running_sequence_even_if_older():
    """The running queue's last element is the newest of the lowest priority: the memory-pressure victim."""
    scheduler = Scheduler(_config(num_kv_blocks=4, scheduler_policy="max_utilization"))
    runner = FakeRunner(scheduler, 4, seed=0)
    scheduler.add_request("old-low", [1] * 8, SamplingParams(max_tokens=8), 0, priority=LOW)  # 2 blocks
    scheduler.add_request("new-high", [2] * 8, SamplingParams(max_tokens=8), 0, priority=HIGH)  # 2 blocks
    scheduled, preempted, _ = _step(scheduler, runner)
    assert scheduled == [1, 0]  # the higher priority is computed first
    scheduled, preempted, _ = _step(scheduler, runner)  # both need a third block; only one can have it
    assert preempted == [0] and scheduled == [1]


def test_shortest_uncached_first_admits_the_fewest_tokens_to_compute_first():
    config = _config(max_batch_size=1, enable_prefix_caching=True, context_scheduling_policy="shortest_uncached_first")
    scheduler = Scheduler(config)
    runner = FakeRunner(scheduler, 4, seed=0)
    cached = list(range(1, 21))
    scheduler.add_request("warm", cached, SamplingParams(max_tokens=1), 0)
    _run_to_end(scheduler, runner)  # its 20 prompt tokens are now in the prefix cache
    scheduler.add_request("long", [9] * 16, SamplingParams(max_tokens=1), 0)  # 16 to compute
    scheduler.add_request("short", [7] * 6, SamplingParams(max_tokens=1), 0)  # 6 to compute
    scheduler.add_request("cached", cached + [5, 5], SamplingParams(max_tokens=1), 0)  # 22 tokens, 20 cached: 2
    scheduler.add_request("urgent", [8] * 30, SamplingParams(max_tokens=1), 0, priority=HIGH)  # priority comes first
    assert _run_to_end(scheduler, runner) == ["urgent", "cached", "short", "long"]
    fcfs = Scheduler(config.replace(context_scheduling_policy="fcfs"))
    runner = FakeRunner(fcfs, 4, seed=0)
    for name, prompt in (("long", [9] * 16), ("short", [7] * 6)):
        fcfs.add_request(name, prompt, SamplingParams(max_tokens=1), 0)
    assert _run_to_end(fcfs, runner) == ["long", "short"]


# -- preemption for a higher priority ------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["guaranteed_no_evict", "max_utilization"])
def test_a_full_batch_preempts_a_lower_priority_request_for_a_higher_one(policy):
    scheduler = Scheduler(_config(max_batch_size=1, scheduler_policy=policy))
    runner = FakeRunner(scheduler, 4, seed=0)
    scheduler.add_request("low", [1] * 6, SamplingParams(max_tokens=6), 0, priority=LOW)
    _step(scheduler, runner)
    _step(scheduler, runner)
    scheduler.add_request("equal", [2] * 3, SamplingParams(max_tokens=2), 0, priority=LOW)
    assert _step(scheduler, runner)[1] == []  # an equal priority waits
    scheduler.add_request("high", [3] * 3, SamplingParams(max_tokens=2), 0, priority=HIGH)
    scheduled, preempted, _ = _step(scheduler, runner)
    assert preempted == [0] and scheduled == [2]  # preempted before the step, so the high one runs at once
    assert _run_to_end(scheduler, runner) == ["high", "low", "equal"]
    assert scheduler.kv_cache.num_free_blocks == scheduler.kv_cache.num_blocks


def test_guaranteed_no_evict_gives_up_a_lower_reservation_for_a_higher_request():
    scheduler = Scheduler(_config(num_kv_blocks=6))
    runner = FakeRunner(scheduler, 4, seed=0)
    scheduler.add_request("low", [1] * 10, SamplingParams(max_tokens=12), 0, priority=LOW)  # reserves all 6 blocks
    _step(scheduler, runner)
    scheduler.add_request("equal", [2] * 4, SamplingParams(max_tokens=4), 0, priority=LOW)
    assert _step(scheduler, runner)[1] == []  # among equals it never preempts
    scheduler.add_request("high", [3] * 4, SamplingParams(max_tokens=4), 0, priority=HIGH)
    assert _step(scheduler, runner)[1] == [0]
    assert _run_to_end(scheduler, runner) == ["high", "equal", "low"]


def test_nothing_is_preempted_when_it_would_not_make_room():
    """The high request needs more blocks than the lower-priority one frees (the rest is held by a higher one): both
    keep running, the high one waits."""
    scheduler = Scheduler(_config(num_kv_blocks=10))
    runner = FakeRunner(scheduler, 4, seed=0)
    scheduler.add_request("top", [1] * 10, SamplingParams(max_tokens=10), 0, priority=1.0)  # 5 blocks reserved
    scheduler.add_request("low", [2] * 2, SamplingParams(max_tokens=6), 0, priority=LOW)  # 2 blocks reserved
    _step(scheduler, runner)
    scheduler.add_request("high", [3] * 20, SamplingParams(max_tokens=4), 0, priority=HIGH)  # 6 blocks
    assert _step(scheduler, runner)[1] == []
    assert scheduler.num_preemptions == 0


def test_beams_are_not_preempted_for_priority():
    scheduler = Scheduler(_config(max_batch_size=2, max_beam_width=2, scheduler_policy="max_utilization"))
    runner = FakeRunner(scheduler, 4, seed=1)
    scheduler.add_request("beams", [1, 2, 3], SamplingParams(max_tokens=6, beam_width=2), 0, priority=LOW)
    _step(scheduler, runner)
    _step(scheduler, runner)
    scheduler.add_request("high", [4] * 3, SamplingParams(max_tokens=2), 0, priority=HIGH)
    assert _step(scheduler, runner)[1] == []
    assert sorted(set(_run_to_end(scheduler, runner))) == ["beams", "high"]
    assert scheduler.num_preemptions == 0


@settings(max_examples=40, deadline=None)
@given(workloads(under_pressure=True))
def test_beams_and_samples_finish_under_random_priorities(workload):
    """The invariant workload of test_refengine_scheduler.py (beams, n > 1, prefix reuse, preemption) with random
    priorities and a short starvation guard: every sample finishes, beams are never preempted, no block leaks."""
    config, requests, seed = workload
    config = config.replace(context_starvation_steps=random.Random(seed).choice([0, 3, 20]))
    scheduler = Scheduler(config)
    runner = FakeRunner(scheduler, config.tokens_per_block, seed)
    rng = random.Random(seed)
    pending = sorted(enumerate(requests), key=lambda item: item[1][0])
    finished, beam_ids, step = set(), set(), 0
    while pending or scheduler.has_unfinished():
        while pending and pending[0][1][0] <= step:
            index, (_, prompt, params) = pending.pop(0)
            scheduler.add_request(f"r{index}", prompt, params, sampling_seed=index, priority=rng.choice([0.0, LOW, 0.5, HIGH, 1.0]))
            if params.beam_width > 1:
                beam_ids.add(f"r{index}")
        step += 1
        assert step < 3000, "the scheduler did not finish the workload"
        if not scheduler.has_unfinished():
            continue
        output = scheduler.schedule()
        beams_now = {s.seq_id for name in beam_ids for s in scheduler.sequences_of(name)}
        assert not beams_now & set(output.preempted_seq_ids)
        assert len(output.scheduled) <= config.max_batch_size
        for update in scheduler.update_from_output(output, runner.execute(output)):
            if update.finish_reason is not None:
                finished.add((update.request_id, update.sample_index))
    assert finished == {(f"r{i}", s) for i, (_, _, params) in enumerate(requests) for s in range(params.n)}
    assert scheduler.kv_cache.num_free_blocks == scheduler.kv_cache.num_blocks


# -- the starvation guard ------------------------------------------------------------------------------------------------
def _flood(starvation_steps, steps):
    """A low request behind a continuous flood of high ones (one arrives every step); the step it finished, or None."""
    scheduler = Scheduler(_config(max_batch_size=1, context_starvation_steps=starvation_steps))
    runner = FakeRunner(scheduler, 4, seed=0)
    scheduler.add_request("high-0", [2] * 3, SamplingParams(max_tokens=2), 0, priority=HIGH)
    scheduler.add_request("low", [1] * 3, SamplingParams(max_tokens=4), 0, priority=LOW)
    for step in range(steps):
        scheduler.add_request(f"high-{step + 1}", [2] * 3, SamplingParams(max_tokens=2), 0, priority=HIGH)
        if "low" in _step(scheduler, runner)[2]:
            return step
    return None


def test_without_the_guard_a_flood_of_high_requests_starves_a_low_one():
    assert _flood(starvation_steps=0, steps=60) is None


def test_the_starvation_guard_admits_a_low_request_after_n_steps_and_keeps_it_in():
    finished_at = _flood(starvation_steps=5, steps=60)
    # Waited more than 5 steps, admitted once the running high request ended, then 4 steps of its own: never preempted.
    assert finished_at is not None and 5 < finished_at <= 5 + 2 + 4


def _equal_priority_schedule(starvation_steps):
    """Every step's (scheduled, preempted) seq ids of a preempting workload of one priority, requests arriving over time."""
    config = _config(max_batch_size=3, num_kv_blocks=9, scheduler_policy="max_utilization", context_starvation_steps=starvation_steps)
    scheduler = Scheduler(config)
    runner = FakeRunner(scheduler, 4, seed=5)
    steps = []
    for step in range(400):
        if step < 8:
            scheduler.add_request(f"r{step}", [step + 1] * (3 + step), SamplingParams(max_tokens=10), 0, priority=LOW)
        if not scheduler.has_unfinished():
            break
        steps.append(_step(scheduler, runner)[:2])
    return steps, scheduler.num_preemptions


def test_the_starvation_guard_changes_nothing_among_equal_priorities():
    """With one priority the starved sequences are the oldest ones, preempted or not: the order stays arrival order."""
    assert EngineConfig().context_starvation_steps > 0 and EngineConfig().context_scheduling_policy.value == "fcfs"
    unguarded, preemptions = _equal_priority_schedule(0)
    assert preemptions > 0
    assert _equal_priority_schedule(2) == (unguarded, preemptions)


# -- the engine: exact recompute, refusals, settings -------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine_config():
    return EngineConfig(max_batch_size=1, tokens_per_block=4, max_input_len=32, max_seq_len=64, max_num_tokens=64)


def _finish(engine):
    order, final = [], {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished:
                order.append(output.request_id)
                final[output.request_id] = output.outputs[0].token_ids
    return order, final


@pytest.mark.parametrize("pressure", ["batch", "kv_cache"])
def test_a_preempted_low_request_finishes_later_with_its_unpreempted_greedy_tokens(small_checkpoint, engine_config, pressure):
    low_prompt, high_prompt = [3, 9, 27, 17, 51, 25, 11, 33, 40, 2], [5, 6, 7, 8]
    config = engine_config if pressure == "batch" else engine_config.replace(max_batch_size=4, num_kv_blocks=6)
    alone = LLMEngine.from_checkpoint(small_checkpoint, config)
    [reference] = alone.generate([low_prompt], GREEDY)
    engine = LLMEngine.from_checkpoint(small_checkpoint, config)
    engine.add_request(low_prompt, GREEDY, request_id="low", priority=0.0)
    for _ in range(4):
        engine.step()
    engine.add_request(high_prompt, SamplingParams(max_tokens=4, temperature=0), request_id="high", priority=1.0)
    order, final = _finish(engine)
    assert order == ["high", "low"] and engine.stats().num_preemptions == 1
    assert final["low"] == reference.outputs[0].token_ids
    assert engine.kv_cache_usage().num_used_blocks == 0


@pytest.mark.parametrize("priority", [-0.01, 1.5, math.nan, math.inf, "high", None, True])
def test_a_bad_priority_is_refused_by_name(small_checkpoint, engine_config, priority):
    engine = LLMEngine.from_checkpoint(small_checkpoint, engine_config)
    with pytest.raises(InvalidRequestError, match=r"^priority: .*" + repr(priority)[:4].replace("(", r"\(")) as error:
        engine.add_request([1, 2], SamplingParams(max_tokens=2), priority=priority)
    assert error.value.field == "priority" and not engine.has_unfinished()


def test_the_bounds_and_the_default_are_accepted(small_checkpoint, engine_config):
    engine = LLMEngine.from_checkpoint(small_checkpoint, engine_config)
    for priority in (0, 1, 0.0, 1.0, DEFAULT_PRIORITY):
        engine.add_request([1, 2], SamplingParams(max_tokens=1), priority=priority)
    assert len(_finish(engine)[0]) == 5


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"context_starvation_steps": -1}, "context_starvation_steps"),
        ({"context_starvation_steps": True}, "context_starvation_steps"),
        ({"context_starvation_steps": "10"}, "context_starvation_steps"),
        ({"context_scheduling_policy": "lifo"}, "context_scheduling_policy"),
    ],
)
def test_bad_priority_settings_are_refused_by_name(changes, field):
    with pytest.raises(EngineConfigError) as error:
        EngineConfig(**changes)
    assert error.value.field == field


def test_static_batching_forms_its_batch_by_priority_and_never_preempts():
    scheduler = Scheduler(_config(max_batch_size=1, batching="static"))
    runner = FakeRunner(scheduler, 4, seed=0)
    scheduler.add_request("low", [1] * 4, SamplingParams(max_tokens=3), 0, priority=LOW)
    scheduler.add_request("high", [2] * 4, SamplingParams(max_tokens=3), 0, priority=HIGH)
    _step(scheduler, runner)  # the batch is formed: the high request
    scheduler.add_request("higher", [3] * 4, SamplingParams(max_tokens=3), 0, priority=1.0)
    assert _run_to_end(scheduler, runner) == ["high", "higher", "low"]
    assert scheduler.num_preemptions == 0
