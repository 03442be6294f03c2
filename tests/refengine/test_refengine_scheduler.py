"""Scheduler invariants, driven by a fabricated model runner (no model involved).

The fake runner keeps a token per KV slot, applies the scheduler's block copies, and checks
before every "forward" that each sequence's cached positions hold that sequence's tokens: a
wrong block table, a missed copy-on-write or a bad prefix reuse shows up as a mismatch.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from refengine import EngineConfig, SamplingParams
from refengine.errors import InvalidRequestError
from refengine.request_validation import validate_request
from refengine.scheduler import FinishReason, Scheduler
from refengine.step_messages import RunnerOutput, SampledToken, SchedulerOutput

VOCAB = 16


class FakeRunner:
    def __init__(self, scheduler: Scheduler, tokens_per_block: int, seed: int) -> None:
        self.scheduler = scheduler
        self.block_size = tokens_per_block
        self.slots: dict[int, int] = {}
        self.rng = random.Random(seed)

    def slot(self, table, position):
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def execute(self, output: SchedulerOutput) -> RunnerOutput:
        for source, destination in output.block_copies:
            for offset in range(self.block_size):
                if source * self.block_size + offset in self.slots:
                    self.slots[destination * self.block_size + offset] = self.slots[source * self.block_size + offset]
        sampled = {}
        for item in output.scheduled:
            sequence = self.scheduler.get_sequence(item.seq_id)
            assert sequence is not None
            assert len(item.block_table) * self.block_size >= item.num_total_tokens
            for position in range(item.num_computed_tokens):
                assert self.slots[self.slot(item.block_table, position)] == sequence.token_ids[position]
            assert list(item.new_token_ids) == sequence.token_ids[item.num_computed_tokens : item.num_total_tokens]
            for offset, token in enumerate(item.new_token_ids):
                self.slots[self.slot(item.block_table, item.num_computed_tokens + offset)] = token
            if item.num_samples and item.sampling_params.beam_width > 1:  # beam search: a log-prob row
                row = torch.log_softmax(torch.tensor([self.rng.gauss(0, 2) for _ in range(VOCAB)]), dim=-1)
                sampled[item.seq_id] = (SampledToken(-1, beam_log_probs=row),)
            elif item.num_samples:
                sampled[item.seq_id] = tuple(SampledToken(self.rng.randrange(VOCAB)) for _ in range(item.num_samples))
        return RunnerOutput(step_id=output.step_id, sampled=sampled)


@st.composite
def workloads(draw, under_pressure=False):
    """Random configs and requests; `under_pressure`: max_utilization with a cache that fits
    only about one request at full length, so preemption happens often."""
    tokens_per_block = draw(st.sampled_from([1, 2, 4, 8]))
    blocks_for_longest_request = -(-36 // tokens_per_block)  # 24 prompt + 12 generated tokens
    spare_blocks = 0 if under_pressure else 2 * blocks_for_longest_request
    config = EngineConfig(
        max_batch_size=draw(st.integers(3 if under_pressure else 1, 6)),
        max_input_len=24,
        max_seq_len=40,
        max_num_tokens=draw(st.integers(4, 48)),
        tokens_per_block=tokens_per_block,
        num_kv_blocks=draw(st.integers(blocks_for_longest_request, blocks_for_longest_request + spare_blocks)),
        scheduler_policy=("max_utilization" if under_pressure else draw(st.sampled_from(["guaranteed_no_evict", "max_utilization"]))),
        enable_chunked_context=draw(st.booleans()),
        enable_prefix_caching=draw(st.booleans()),
        max_num_samples=3,
        max_beam_width=3,
    )
    shared_prefix = draw(st.lists(st.integers(0, VOCAB - 1), min_size=4, max_size=12))
    requests = []
    for _ in range(draw(st.integers(1, 12))):
        own = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=14))
        prompt = (shared_prefix + own)[:24] if draw(st.booleans()) else own
        beam_width = draw(st.sampled_from([1, 1, 1, 2, 3]))
        params = SamplingParams(
            max_tokens=draw(st.integers(1, 12)),
            n=draw(st.integers(1, 3 if beam_width == 1 else beam_width)),
            end_id=None if under_pressure else draw(st.one_of(st.none(), st.integers(0, VOCAB - 1))),
            stop_token_ids=draw(st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=2), max_size=1)),
            beam_width=beam_width,
            early_stopping=draw(st.sampled_from([False, True, "never"])),
        )
        try:
            validate_request(prompt, params, config, VOCAB)
        except InvalidRequestError:
            continue  # the engine would refuse it; the scheduler is only given admissible requests
        arrives_at_step = draw(st.integers(0, 5))
        requests.append((arrives_at_step, prompt, params))
    return config, requests, draw(st.integers(0, 1000))


@settings(max_examples=120, deadline=None)
@given(workloads())
def test_scheduler_invariants(workload):
    _run_workload(*workload)


@settings(max_examples=60, deadline=None)
@given(workloads(under_pressure=True))
def test_scheduler_invariants_under_preemption(workload):
    _run_workload(*workload)


def _run_workload(config, requests, seed):
    scheduler = Scheduler(config)
    runner = FakeRunner(scheduler, config.tokens_per_block, seed)
    outputs: dict[tuple[str, int], list[int]] = {}
    reasons: dict[tuple[str, int], FinishReason] = {}
    pending = sorted(enumerate(requests), key=lambda item: item[1][0])
    step = 0
    while pending or scheduler.has_unfinished():
        while pending and pending[0][1][0] <= step:
            index, (_, prompt, params) = pending.pop(0)
            scheduler.add_request(f"r{index}", prompt, params, sampling_seed=index)
        step += 1
        assert step < 2000, "scheduler did not finish the workload"
        if not scheduler.has_unfinished():
            continue
        output = scheduler.schedule()
        assert output.num_scheduled_tokens <= config.max_num_tokens
        assert len(output.scheduled) <= config.max_batch_size
        assert len({item.seq_id for item in output.scheduled}) == len(output.scheduled)
        assert output.scheduled or output.preempted_seq_ids, "a step made no progress"
        if config.scheduler_policy.value == "guaranteed_no_evict":
            assert not output.preempted_seq_ids
        for update in scheduler.update_from_output(output, runner.execute(output)):
            key = (update.request_id, update.sample_index)
            if update.replaces_output:  # a beam, whole: it may now continue another beam
                outputs[key] = []
            outputs.setdefault(key, []).extend(update.new_token_ids)
            if update.finish_reason is not None:
                reasons[key] = update.finish_reason
        assert scheduler.num_running <= config.max_batch_size
    expected = {(f"r{i}", s) for i, (_, _, params) in enumerate(requests) for s in range(params.n)}
    assert set(reasons) == expected  # every sample of every request finished
    for index, (_, _, params) in enumerate(requests):
        for sample in range(params.n):
            tokens = outputs.get((f"r{index}", sample), [])
            assert len(tokens) <= params.max_tokens
            if reasons[(f"r{index}", sample)] is FinishReason.LENGTH:
                assert len(tokens) == params.max_tokens
    event(f"requests: {min(len(requests), 5)}{'+' if len(requests) >= 5 else ''}")
    event(f"preempted: {scheduler.num_preemptions > 0}")
    event(f"prefix hits: {scheduler.num_prefix_cache_hit_tokens > 0}")
    event(f"forked: {any(params.n > 1 for _, _, params in requests)}")
    event(f"beams: {any(params.beam_width > 1 for _, _, params in requests)}")
    kv = scheduler.kv_cache
    assert kv.num_free_blocks == kv.num_blocks
    assert all(block.ref_count == 0 for block in kv.pool.blocks())


def _decode_config(**changes):
    values = dict(max_batch_size=4, max_num_tokens=16, tokens_per_block=4, num_kv_blocks=16, max_input_len=32, max_seq_len=64)
    values.update(changes)
    return EngineConfig(**values)


def test_running_requests_are_served_before_waiting_ones():
    scheduler = Scheduler(_decode_config(max_num_tokens=8, enable_chunked_context=True))
    scheduler.add_request("old", [1] * 6, SamplingParams(max_tokens=4), 0)
    first = scheduler.schedule()
    scheduler.update_from_output(first, RunnerOutput(first.step_id, {0: (SampledToken(3),)}))
    scheduler.add_request("new", [2] * 20, SamplingParams(max_tokens=4), 0)
    second = scheduler.schedule()
    assert [item.seq_id for item in second.scheduled] == [0, 1]  # the decode comes first
    assert [item.num_new_tokens for item in second.scheduled] == [1, 7]  # then a prefill chunk


def test_max_utilization_preempts_the_newest_request():
    config = _decode_config(num_kv_blocks=4, scheduler_policy="max_utilization")
    scheduler = Scheduler(config)
    scheduler.add_request("a", [1] * 8, SamplingParams(max_tokens=8), 0)  # 2 blocks
    scheduler.add_request("b", [2] * 8, SamplingParams(max_tokens=8), 0)  # 2 blocks
    output = scheduler.schedule()
    assert len(output.scheduled) == 2
    sampled = {item.seq_id: (SampledToken(5),) for item in output.scheduled}
    scheduler.update_from_output(output, RunnerOutput(output.step_id, sampled))
    output = scheduler.schedule()  # both need a third block; only "a" can have one
    assert output.preempted_seq_ids == (1,)
    assert [item.seq_id for item in output.scheduled] == [0]
    assert scheduler.num_waiting == 1 and scheduler.num_preemptions == 1


def test_a_request_cut_while_it_is_preempted_frees_everything():
    """A client that goes away while its request waits, preempted: the abort finds it in the
    waiting queue, its blocks (already returned) stay free, the other request runs on."""
    config = _decode_config(num_kv_blocks=4, scheduler_policy="max_utilization")
    scheduler = Scheduler(config)
    scheduler.add_request("a", [1] * 8, SamplingParams(max_tokens=8), 0)
    scheduler.add_request("b", [2] * 8, SamplingParams(max_tokens=8), 0)
    output = scheduler.schedule()
    scheduler.update_from_output(output, RunnerOutput(output.step_id, {item.seq_id: (SampledToken(5),) for item in output.scheduled}))
    output = scheduler.schedule()
    assert output.preempted_seq_ids == (1,) and scheduler.num_waiting == 1
    [aborted] = scheduler.abort_request("b")
    assert aborted.finish_reason is FinishReason.ABORTED
    assert scheduler.num_waiting == 0 and scheduler.abort_request("b") == []
    scheduler.update_from_output(output, RunnerOutput(output.step_id, {item.seq_id: (SampledToken(6),) for item in output.scheduled}))
    while scheduler.has_unfinished():
        output = scheduler.schedule()
        assert not output.preempted_seq_ids
        scheduler.update_from_output(output, RunnerOutput(output.step_id, {item.seq_id: (SampledToken(7),) for item in output.scheduled}))
    assert scheduler.kv_cache.num_used_blocks == 0


def test_guaranteed_no_evict_waits_for_room():
    config = _decode_config(num_kv_blocks=4)
    scheduler = Scheduler(config)
    scheduler.add_request("a", [1] * 8, SamplingParams(max_tokens=8), 0)  # reserves 4 blocks
    scheduler.add_request("b", [2] * 2, SamplingParams(max_tokens=2), 0)
    output = scheduler.schedule()
    assert [item.seq_id for item in output.scheduled] == [0]
    assert scheduler.num_waiting == 1


def test_abort_frees_blocks_immediately():
    scheduler = Scheduler(_decode_config())
    scheduler.add_request("a", [1] * 10, SamplingParams(max_tokens=8), 0)
    scheduler.schedule()
    assert scheduler.kv_cache.num_used_blocks == 3
    [aborted] = scheduler.abort_request("a")
    assert aborted.finish_reason is FinishReason.ABORTED
    assert scheduler.kv_cache.num_used_blocks == 0
    assert scheduler.abort_request("a") == []
    assert not scheduler.has_unfinished()


def test_runner_must_return_every_sample():
    scheduler = Scheduler(_decode_config())
    scheduler.add_request("a", [1, 2], SamplingParams(max_tokens=2, n=2), 0)
    output = scheduler.schedule()
    with pytest.raises(ValueError, match="expected 2"):
        scheduler.update_from_output(output, RunnerOutput(output.step_id, {0: (SampledToken(1),)}))


def test_beams_are_never_preempted_a_request_without_beams_is():
    """Beam requests reserve their blocks and are not preemption victims (the decision of #15:
    refuse to preempt rather than recompute beams); the request beside them is preempted instead."""
    config = _decode_config(scheduler_policy="max_utilization", num_kv_blocks=10, max_beam_width=2)
    scheduler = Scheduler(config)
    runner = FakeRunner(scheduler, config.tokens_per_block, seed=3)
    scheduler.add_request("beams", [1, 2], SamplingParams(max_tokens=14, beam_width=2, n=2), sampling_seed=0)
    scheduler.add_request("other", list(range(9)), SamplingParams(max_tokens=20), sampling_seed=1)
    beam_ids, preempted, finished = set(), [], {}
    while scheduler.has_unfinished():
        beam_ids |= {s.seq_id for s in scheduler.sequences_of("beams")}
        output = scheduler.schedule()
        preempted += output.preempted_seq_ids
        for update in scheduler.update_from_output(output, runner.execute(output)):
            if update.finish_reason is not None:
                finished[(update.request_id, update.sample_index)] = update
    assert preempted and not beam_ids & set(preempted)
    assert set(finished) == {("beams", 0), ("beams", 1), ("other", 0)}
    assert len(finished[("beams", 0)].new_token_ids) == 14 and finished[("beams", 0)].cum_log_prob is not None
    assert scheduler.kv_cache.num_free_blocks == scheduler.kv_cache.num_blocks
