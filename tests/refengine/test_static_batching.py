"""Static batching (`EngineConfig.batching="static"`): TensorRT-LLM's V1 batching.

A batch is admitted together and held until its longest request ends; finished rows keep their
slot and KV blocks and are computed (with a padding token) every step; users still see exactly
the tokens inflight batching gives them.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from refengine import EngineConfig, LLMEngine, SamplingParams
from refengine.errors import EngineConfigError, InvalidRequestError
from refengine.request_validation import validate_request
from refengine.scheduler import FinishReason, Scheduler, SequenceStatus
from refengine.scheduler.static_batch import PADDING_TOKEN_ID
from refengine.step_messages import RunnerOutput, SampledToken, SchedulerOutput

VOCAB = 16


# -- configuration ------------------------------------------------------------------------------


def test_batching_defaults_to_inflight_and_parses_static():
    assert EngineConfig().batching.value == "inflight"
    assert EngineConfig(batching="STATIC").batching.value == "static"
    config = EngineConfig.from_build_config({"max_batch_size": 4, "max_seq_len": 64, "max_input_len": 32}, batching="static")
    assert config.batching.value == "static" and config.max_batch_size == 4


@pytest.mark.parametrize("value", ["v1", "", None, 3, "inflight_fused_batching"])
def test_invalid_batching_value_is_refused(value):
    with pytest.raises(EngineConfigError) as error:
        EngineConfig(batching=value)
    assert error.value.field == "batching"


def test_static_batching_needs_guaranteed_no_evict():
    with pytest.raises(EngineConfigError) as error:
        EngineConfig(batching="static", scheduler_policy="max_utilization")
    assert error.value.field == "batching"
    EngineConfig(batching="inflight", scheduler_policy="max_utilization")  # still fine


# -- the engine, on a small random checkpoint -----------------------------------------------------


def _engine(checkpoint, batching, **changes):
    values = dict(max_batch_size=8, max_num_tokens=512, tokens_per_block=4, max_input_len=64, max_seq_len=96)
    values.update(changes)
    return LLMEngine.from_checkpoint(checkpoint, EngineConfig(batching=batching, **values))


def _mixed_batch():
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 64) for _ in range(rng.randint(1, 40))] for _ in range(7)]
    params = [
        SamplingParams(max_tokens=1, temperature=0),
        SamplingParams(max_tokens=23, temperature=0),
        SamplingParams(max_tokens=5, temperature=0),
        SamplingParams(max_tokens=17, temperature=0, end_id=prompts[0][0]),
        SamplingParams(max_tokens=9, temperature=0, stop_token_ids=[[prompts[1][-1]]]),
        SamplingParams(max_tokens=12, temperature=0, repetition_penalty=1.3, logprobs=2),
        SamplingParams(max_tokens=8, temperature=0.8, top_k=10, seed=11, n=2),
    ]
    return prompts, params


def _run(engine, prompts, params, record=None, logprobs=None):
    """Add everything at once, step until done; returns ({request index: ((tokens, finish
    reason) per sample)}, steps). Logprobs go to `logprobs` when given."""
    ids = {engine.add_request(p, sp): i for i, (p, sp) in enumerate(zip(prompts, params))}
    finals, steps = {}, 0
    logprobs = {} if logprobs is None else logprobs
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished:
                finals[ids[output.request_id]] = tuple((c.token_ids, c.finish_reason) for c in output.outputs)
                logprobs[ids[output.request_id]] = [c.logprobs for c in output.outputs]
        steps += 1
        if record is not None:
            record(engine)
    return finals, steps


def _recording_scheduler(engine):
    """Wrap the scheduler's `schedule` to keep every SchedulerOutput."""
    outputs: list[SchedulerOutput] = []
    original = engine.scheduler.schedule

    def schedule():
        outputs.append(original())
        return outputs[-1]

    engine.scheduler.schedule = schedule
    return outputs


@pytest.mark.parametrize("max_batch_size", [8, 3])
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_static_outputs_are_identical_to_inflight(small_checkpoint, max_batch_size, prefix_caching):
    prompts, params = _mixed_batch()
    prompts.append(prompts[1][:20] + [5, 6])  # shares blocks with request 1 (prefix caching)
    params.append(SamplingParams(max_tokens=6, temperature=0))
    results, logprobs = {}, {"inflight": {}, "static": {}}
    for batching in ("inflight", "static"):
        engine = _engine(small_checkpoint, batching, max_batch_size=max_batch_size, enable_prefix_caching=prefix_caching)
        results[batching], _ = _run(engine, prompts, params, logprobs=logprobs[batching])
        kv = engine.scheduler.kv_cache
        assert kv.num_free_blocks == kv.num_blocks  # everything released at the end
    assert results["static"] == results["inflight"]  # token for token, same finish reasons
    # Log-probabilities agree up to float32 rounding (a row's batch mates differ).
    [static_logprobs], [inflight_logprobs] = logprobs["static"][5], logprobs["inflight"][5]
    assert [t.token_id for t in static_logprobs] == [t.token_id for t in inflight_logprobs]
    for ours, theirs in zip(static_logprobs, inflight_logprobs):
        assert ours.logprob == pytest.approx(theirs.logprob, abs=1e-5)
    assert len(results["static"]) == len(prompts)
    reasons = {c[1] for outputs in results["static"].values() for c in outputs}
    assert "length" in reasons  # (the end_id / stop requests may or may not stop early)


def test_a_static_batch_takes_as_many_steps_as_its_longest_request(small_checkpoint):
    rng = random.Random(5)
    lengths = [1, 3, 7, 12, 4]
    prompts = [[rng.randrange(3, 64) for _ in range(rng.randint(2, 30))] for _ in lengths]
    params = [SamplingParams(max_tokens=n, temperature=0) for n in lengths]
    engine = _engine(small_checkpoint, "static")
    outputs, steps = _run(engine, prompts, params)
    assert [len(outputs[i][0][0]) for i in range(len(lengths))] == lengths
    assert steps == max(lengths)  # 1 prefill step (samples the first token) + 11 decode steps

    engine = _engine(small_checkpoint, "static", max_batch_size=2)  # batches [1, 3], [7, 12], [4]
    _, steps = _run(engine, prompts, params)
    assert steps == 3 + 12 + 4
    engine = _engine(small_checkpoint, "inflight", max_batch_size=2)
    _, inflight_steps = _run(engine, prompts, params)
    assert inflight_steps < 3 + 12 + 4  # the freed rows are refilled at once


def test_a_prefill_budget_spreads_the_batch_prompts_over_steps(small_checkpoint):
    rng = random.Random(6)
    prompts = [[rng.randrange(3, 64) for _ in range(30)] for _ in range(4)]
    params = [SamplingParams(max_tokens=n, temperature=0) for n in (2, 3, 6, 4)]
    engine = _engine(small_checkpoint, "static", max_num_tokens=64)  # two prompts per step
    records = _recording_scheduler(engine)
    outputs, steps = _run(engine, prompts, params)
    first, second = records[0], records[1]
    assert [item.num_new_tokens for item in first.scheduled] == [30, 30]
    assert sorted(item.num_new_tokens for item in second.scheduled) == [1, 1, 30, 30]  # prompts, then decodes
    # All four are one batch, held until its longest request (prefilled in the second step,
    # 6 tokens) ends: 1 + 6 steps, every row in every step after the first.
    assert steps == 1 + 6
    assert all(len(o.scheduled) == 4 for o in records[1:])
    reference, _ = _run(_engine(small_checkpoint, "inflight", max_num_tokens=64), prompts, params)
    assert outputs == reference


def test_finished_rows_are_computed_every_step_until_the_batch_ends(small_checkpoint):
    rng = random.Random(8)
    lengths = [2, 9, 4]  # batch 1 (max_batch_size 3): ends after 9 steps; then batch 2
    later = [6, 1]
    prompts = [[rng.randrange(3, 64) for _ in range(rng.randint(4, 20))] for _ in lengths + later]
    params = [SamplingParams(max_tokens=n, temperature=0, end_id=None) for n in lengths + later]
    engine = _engine(small_checkpoint, "static", max_batch_size=3)
    records = _recording_scheduler(engine)
    used_blocks: list[int] = []
    padding_rows: list[int] = []
    outputs, steps = _run(
        engine, prompts, params, record=lambda e: (used_blocks.append(e.kv_cache_usage().num_used_blocks), padding_rows.append(e.scheduler.num_padding_rows))
    )
    assert steps == 9 + 6

    batch1 = records[:9]
    seq_ids = [item.seq_id for item in batch1[0].scheduled]
    assert len(seq_ids) == 3
    assert batch1[0].num_scheduled_tokens == sum(len(p) for p in prompts[:3])
    for step, output in enumerate(batch1[1:], start=1):
        assert [item.seq_id for item in output.scheduled] == seq_ids  # every row, every step
        assert output.num_scheduled_tokens == 3  # one token per row, finished or not
        for item, n in zip(output.scheduled, lengths):
            if step >= n:  # finished at step n - 1: a padding row at its frozen position
                assert item.new_token_ids == (PADDING_TOKEN_ID,)
                assert item.num_computed_tokens == len(prompts[seq_ids.index(item.seq_id)]) + n - 1
                assert item.num_samples == 1  # logits computed and sampled, then discarded
            else:
                assert item.num_computed_tokens == len(prompts[seq_ids.index(item.seq_id)]) + step - 1
    assert padding_rows[:9] == [0, 1, 1, 2, 2, 2, 2, 2, 0]  # after each step (2 and 4 finish at steps 1, 3)
    assert used_blocks[1] >= used_blocks[0] and min(used_blocks[1:8]) >= used_blocks[1]  # nothing freed

    # The next batch is admitted only after the longest request of the first one ended.
    batch2 = records[9:]
    assert all(item.seq_id not in seq_ids for output in batch2 for item in output.scheduled)
    assert all(item.seq_id in seq_ids for output in batch1 for item in output.scheduled)
    assert [item.num_new_tokens for item in batch2[0].scheduled] == [len(p) for p in prompts[3:]]
    assert [len(o.scheduled) for o in batch2] == [2] * 6
    assert [len(outputs[i][0][0]) for i in range(5)] == lengths + later
    # Padding tokens: rows 2 and 4 of batch 1 for 7 and 5 steps, row 1 of batch 2 for 5 steps.
    assert engine.scheduler.num_padding_tokens == 7 + 5 + 5
    kv = engine.scheduler.kv_cache
    assert kv.num_free_blocks == kv.num_blocks


def test_finished_requests_report_when_they_finish(small_checkpoint):
    """Static batching holds the rows, not the outputs: a short request's final output comes at
    the step it finishes, not when its batch ends."""
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    params = [SamplingParams(max_tokens=2, temperature=0), SamplingParams(max_tokens=10, temperature=0)]
    engine = _engine(small_checkpoint, "static")
    short = engine.add_request(prompts[0], params[0])
    engine.add_request(prompts[1], params[1])
    finished_at = None
    for step in range(10):
        for output in engine.step():
            if output.request_id == short and output.finished:
                finished_at = step
    assert finished_at == 1
    assert not engine.has_unfinished()


def test_aborting_the_last_running_request_ends_the_batch(small_checkpoint):
    engine = _engine(small_checkpoint, "static", max_batch_size=2)
    engine.add_request([4, 5, 6], SamplingParams(max_tokens=1, temperature=0))
    long_id = engine.add_request([7, 8, 9], SamplingParams(max_tokens=50, temperature=0))
    waiting = engine.add_request([10, 11], SamplingParams(max_tokens=3, temperature=0))
    engine.step()
    engine.step()
    assert engine.scheduler.num_padding_rows == 1 and engine.scheduler.num_waiting == 1
    engine.abort(long_id)
    assert engine.scheduler.num_padding_rows == 0
    finals = {}
    while engine.has_unfinished():
        for output in engine.step():
            finals[output.request_id] = output
    assert finals[long_id].outputs[0].finish_reason == "aborted"
    assert len(finals[waiting].outputs[0].token_ids) == 3
    kv = engine.scheduler.kv_cache
    assert kv.num_free_blocks == kv.num_blocks


# -- scheduler invariants, with a fabricated runner --------------------------------------------


class SlotCheckingRunner:
    """Keeps a token per KV slot; checks each row's cached positions hold that row's tokens (so a
    padding row overwriting a shared block, or a wrong block table, shows up)."""

    def __init__(self, scheduler: Scheduler, tokens_per_block: int, seed: int) -> None:
        self.scheduler = scheduler
        self.block_size = tokens_per_block
        self.slots: dict[int, int] = {}
        self.tokens: dict[int, list[int]] = {}  # seq id -> its tokens (kept after it finishes)
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
            if sequence is not None:
                self.tokens[item.seq_id] = sequence.token_ids
                expected_new = sequence.token_ids[item.num_computed_tokens : item.num_total_tokens]
                assert list(item.new_token_ids) == expected_new
            else:  # a padding row: one token right after its frozen tokens
                assert item.num_new_tokens == 1 and item.num_computed_tokens <= len(self.tokens[item.seq_id])
            tokens = self.tokens[item.seq_id]
            assert len(item.block_table) * self.block_size >= item.num_total_tokens
            for position in range(item.num_computed_tokens):
                assert self.slots[self.slot(item.block_table, position)] == tokens[position]
            for offset, token in enumerate(item.new_token_ids):
                self.slots[self.slot(item.block_table, item.num_computed_tokens + offset)] = token
            if item.num_samples:
                sampled[item.seq_id] = tuple(SampledToken(self.rng.randrange(VOCAB)) for _ in range(item.num_samples))
        return RunnerOutput(step_id=output.step_id, sampled=sampled)


@st.composite
def static_workloads(draw):
    tokens_per_block = draw(st.sampled_from([1, 2, 4, 8]))
    blocks_for_longest_request = -(-36 // tokens_per_block)
    config = EngineConfig(
        batching="static",
        max_batch_size=draw(st.integers(1, 6)),
        max_input_len=24,
        max_seq_len=40,
        max_num_tokens=draw(st.integers(8, 48)),
        tokens_per_block=tokens_per_block,
        num_kv_blocks=draw(st.integers(blocks_for_longest_request, 4 * blocks_for_longest_request)),
        enable_chunked_context=draw(st.booleans()),
        enable_prefix_caching=draw(st.booleans()),
        max_num_samples=3,
    )
    shared_prefix = draw(st.lists(st.integers(0, VOCAB - 1), min_size=4, max_size=12))
    requests = []
    for _ in range(draw(st.integers(1, 12))):
        own = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=14))
        prompt = (shared_prefix + own)[:24] if draw(st.booleans()) else own
        params = SamplingParams(
            max_tokens=draw(st.integers(1, 12)),
            n=draw(st.integers(1, 3)),
            end_id=draw(st.one_of(st.none(), st.integers(0, VOCAB - 1))),
            stop_token_ids=draw(st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=2), max_size=1)),
        )
        try:
            validate_request(prompt, params, config, VOCAB)
        except InvalidRequestError:
            continue
        requests.append((draw(st.integers(0, 5)), prompt, params))
    return config, requests, draw(st.integers(0, 1000))


@settings(max_examples=120, deadline=None)
@given(static_workloads())
def test_static_scheduler_invariants(workload):
    config, requests, seed = workload
    scheduler = Scheduler(config)
    runner = SlotCheckingRunner(scheduler, config.tokens_per_block, seed)
    reasons: dict[tuple[str, int], FinishReason] = {}
    outputs: dict[tuple[str, int], list[int]] = {}
    pending = sorted(enumerate(requests), key=lambda item: item[1][0])
    added: list[str] = []
    step = 0
    computed_padding_rows = False

    def running():
        return {s.seq_id: s for r in added for s in scheduler.sequences_of(r) if s.status is SequenceStatus.RUNNING}

    while pending or scheduler.has_unfinished():
        while pending and pending[0][1][0] <= step:
            index, (_, prompt, params) = pending.pop(0)
            scheduler.add_request(f"r{index}", prompt, params, sampling_seed=index)
            added.append(f"r{index}")
        step += 1
        assert step < 2000, "scheduler did not finish the workload"
        if not scheduler.has_unfinished():
            continue
        before = running()
        decoding = {i for i, s in before.items() if s.num_uncomputed_tokens == 1 and scheduler.kv_cache.has_sequence(i)}
        padding_rows = scheduler.num_padding_rows
        waiting = scheduler.num_waiting
        output = scheduler.schedule()
        after = running()
        assert output.scheduled and not output.preempted_seq_ids
        assert output.num_scheduled_tokens <= config.max_num_tokens
        ids = [item.seq_id for item in output.scheduled]
        assert len(set(ids)) == len(ids) <= config.max_batch_size
        if before:  # a batch is running: nobody joins it
            assert set(after) == set(before) and scheduler.num_waiting == waiting
            if output.num_scheduled_tokens < config.max_num_tokens:  # prompts left room: every row computes
                assert decoding <= set(ids)
                assert sum(1 for i in ids if scheduler.get_sequence(i) is None) == padding_rows
                computed_padding_rows = computed_padding_rows or padding_rows > 0
        else:  # a new batch, from the waiting queue
            assert padding_rows == 0 and after and scheduler.num_waiting == waiting - len(after)
            assert sum(s.num_pending_samples for s in after.values()) <= config.max_batch_size
        for update in scheduler.update_from_output(output, runner.execute(output)):
            key = (update.request_id, update.sample_index)
            outputs.setdefault(key, []).extend(update.new_token_ids)
            if update.finish_reason is not None:
                reasons[key] = update.finish_reason
            if update.seq_id not in runner.tokens:  # a fork that finished on its first token
                prompt = requests[int(update.request_id[1:])][1]
                runner.tokens[update.seq_id] = list(prompt) + list(update.new_token_ids)
        if scheduler.num_running == 0:
            assert scheduler.num_padding_rows == 0  # the batch ended: its rows are released
        else:
            assert scheduler.num_padding_rows + scheduler.num_running <= config.max_batch_size
    expected = {(f"r{i}", s) for i, (_, _, params) in enumerate(requests) for s in range(params.n)}
    assert set(reasons) == expected
    for index, (_, _, params) in enumerate(requests):
        for sample in range(params.n):
            tokens = outputs.get((f"r{index}", sample), [])
            assert len(tokens) <= params.max_tokens
            if reasons[(f"r{index}", sample)] is FinishReason.LENGTH:
                assert len(tokens) == params.max_tokens
    event(f"forked: {any(params.n > 1 for _, _, params in requests)}")
    event(f"prefix hits: {scheduler.num_prefix_cache_hit_tokens > 0}")
    event(f"padding rows computed: {computed_padding_rows}")
    kv = scheduler.kv_cache
    assert kv.num_free_blocks == kv.num_blocks
    assert all(block.ref_count == 0 for block in kv.pool.blocks())
