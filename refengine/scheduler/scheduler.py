"""The scheduler: one token-budget loop per step.

Each step it spends at most `max_num_tokens` tokens on at most `max_batch_size` sequences; what
they are is its batching policy's plan (`policy.py`). There are no prefill/decode phases: a
step mixes prefill chunks and decodes. The scheduler owns the requests, their sequences, the
waiting and running queues and the KV-cache manager; the model runner only sees the block
tables in the `SchedulerOutput`. It applies each step's sampled tokens: extends, forks (n > 1)
and finishes sequences, and runs the beam groups' search.

Priority (refengine/priority.py, higher first): both queues are ordered by (priority, arrival,
sample index), waiting sequences are offered a place in `admission_order.py`'s order (the
starvation guard, then priority), and under inflight batching a waiting sequence that does not fit
preempts running ones of lower priority (`priority_preemption.py`). With one priority for all,
scheduling is first come first served.

`batching="inflight"` (`inflight_policy.py`): running sequences first, then waiting ones;
when blocks run out the last running sequence (the newest of the lowest priority) is preempted by
recompute. `guaranteed_no_evict` admits only what can finish, so it never preempts among equal
priorities; `max_utilization` admits whatever fits now.

`batching="static"` (TensorRT-LLM's V1 batching, Hugging Face `generate`; `static_batch.py`,
`static_policy.py`): a batch is formed only when none is running and is held until its longest
request ends; finished sequences stay in it as padding rows that are computed every step.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence as SequenceType
from typing import TYPE_CHECKING

import torch

from refengine.config import BatchingMode, EngineConfig
from refengine.kv_cache import KVCacheManager
from refengine.priority import DEFAULT_PRIORITY
from refengine.sampling import SamplingParams
from refengine.scheduler.beams import BeamGroups, finish_beams, reassign_beams, running_beam_updates
from refengine.scheduler.inflight_policy import InflightBatching
from refengine.scheduler.policy import BatchingPolicy, StepPlan
from refengine.scheduler.queue import SequenceQueue
from refengine.scheduler.scheduled import scheduled_sequence
from refengine.scheduler.sequence import FinishReason, Sequence, SequenceStatus, SequenceUpdate
from refengine.scheduler.speculative_update import apply_verified
from refengine.scheduler.static_batch import padding_row
from refengine.scheduler.static_policy import StaticBatching
from refengine.step_messages import RunnerOutput, SchedulerOutput

if TYPE_CHECKING:
    from refengine.guided.state import GrammarState
    from refengine.lora.adapter import LoraAdapter


class Scheduler:
    def __init__(self, config: EngineConfig, long_prompt_threshold: int | None = None) -> None:
        """`long_prompt_threshold`: the model fills the KV cache differently for prompts longer than this
        (`KVCacheLayout.long_prompt_threshold`); their cached prefixes are kept apart."""
        self._config = config
        self._long_prompt_threshold = long_prompt_threshold
        self._kv = KVCacheManager(
            num_blocks=config.total_kv_blocks,
            tokens_per_block=config.tokens_per_block,
            enable_prefix_caching=config.enable_prefix_caching,
        )
        self._waiting = SequenceQueue()
        self._running = SequenceQueue()
        self._beams = BeamGroups()
        self._policy: BatchingPolicy = (
            StaticBatching(config, self._kv, self._waiting, self._running, self.has_request)
            if config.batching is BatchingMode.STATIC
            else InflightBatching(config, self._kv, self._waiting, self._running, self._beams)
        )
        self._sequences: dict[int, Sequence] = {}
        self._seq_ids_by_request: dict[str, list[int]] = {}
        self._seq_ids = itertools.count()
        self._arrivals = itertools.count()
        self._step_ids = itertools.count()
        self._num_schedules = 0  # steps scheduled so far: the clock of the starvation guard
        self._finished_since_last_step: list[int] = []
        self._num_preemptions = 0
        self._num_padding_tokens = 0
        self._num_prefix_cache_hit_tokens = 0
        self._num_prefix_cache_hits = 0  # admissions that reused at least one cached block
        self._num_prompt_tokens_computed = 0  # prompt tokens scheduled; recompute after preemption included

    def _is_long_prompt(self, prompt_len: int) -> bool:
        return self._long_prompt_threshold is not None and prompt_len > self._long_prompt_threshold

    # -- state -----------------------------------------------------------------------------
    @property
    def kv_cache(self) -> KVCacheManager:
        return self._kv

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_preemptions(self) -> int:
        return self._num_preemptions

    @property
    def num_prefix_cache_hit_tokens(self) -> int:
        """Prompt tokens whose K/V were reused from the cache instead of computed."""
        return self._num_prefix_cache_hit_tokens

    @property
    def num_prefix_cache_hits(self) -> int:
        return self._num_prefix_cache_hits

    @property
    def num_prompt_tokens_computed(self) -> int:
        return self._num_prompt_tokens_computed

    @property
    def num_padding_rows(self) -> int:
        """Static batching: finished sequences still held (and computed) in the running batch."""
        return self._policy.num_padding_rows

    @property
    def num_padding_tokens(self) -> int:
        """Static batching: padding tokens computed (and discarded) by held rows so far."""
        return self._num_padding_tokens

    def get_sequence(self, seq_id: int) -> Sequence | None:
        """An unfinished sequence by id (None once finished)."""
        return self._sequences.get(seq_id)

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def has_request(self, request_id: str) -> bool:
        return request_id in self._seq_ids_by_request

    def sequences_of(self, request_id: str) -> list[Sequence]:
        return [self._sequences[i] for i in self._seq_ids_by_request.get(request_id, [])]

    # -- requests --------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: SequenceType[int],
        params: SamplingParams,
        sampling_seed: int,
        grammar: GrammarState | None = None,
        lora: LoraAdapter | None = None,
        priority: float = DEFAULT_PRIORITY,
    ) -> Sequence:
        """Queue a request. It must already be validated (see `request_validation`); `grammar` is its
        guided-decoding state (the sequence owns it; forks of the sequence fork it); `lora` its adapter, whose
        sequences reuse only prefix blocks computed under it; `priority` in [0, 1], higher first."""
        if request_id in self._seq_ids_by_request:
            raise KeyError(f"request {request_id!r} is already scheduled")
        sequence = Sequence(
            seq_id=next(self._seq_ids),
            request_id=request_id,
            sample_index=0,
            prompt_token_ids=tuple(prompt_token_ids),
            params=params,
            sampling_seed=sampling_seed,
            arrival_order=next(self._arrivals),
            num_pending_samples=params.num_sequences,
            grammar=grammar,
            prefix_salt=(b"long-prompt" if self._is_long_prompt(len(prompt_token_ids)) else b"") + (lora.prefix_salt if lora else b""),
            lora=lora,
            priority=priority,
            arrival_step=self._num_schedules,
        )
        if params.beam_width > 1:
            self._beams.add(sequence)
        self._sequences[sequence.seq_id] = sequence
        self._seq_ids_by_request[request_id] = [sequence.seq_id]
        self._waiting.insert(sequence)
        return sequence

    def abort_request(self, request_id: str) -> list[Sequence]:
        """Finish every sequence of the request now, freeing its blocks. Unknown id: no-op."""
        aborted = []
        for sequence in self.sequences_of(request_id):
            self._finish(sequence, FinishReason.ABORTED)
            aborted.append(sequence)
        return aborted

    # -- one step --------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        plan = self._policy.schedule(self._num_schedules)
        self._num_schedules += 1
        self._num_preemptions += len(plan.preempted)
        return self._make_output(plan)

    def update_from_output(self, scheduler_output: SchedulerOutput, runner_output: RunnerOutput) -> list[SequenceUpdate]:
        """Apply the sampled tokens: extend, fork (n > 1), finish; returns what changed."""
        updates: list[SequenceUpdate] = []
        beam_rows: dict[int, torch.Tensor] = {}
        for item in scheduler_output.scheduled:
            sequence = self._sequences.get(item.seq_id)
            if sequence is None or sequence.status is not SequenceStatus.RUNNING:
                continue
            self._kv.cache_computed_blocks(sequence.seq_id, sequence.token_ids, sequence.num_computed_tokens, sequence.prefix_salt)
            if item.num_samples == 0:
                continue
            samples = runner_output.sampled.get(item.seq_id, ())
            if item.draft_token_ids:
                updates.append(apply_verified(sequence, item, samples, self._kv))
                if updates[-1].finish_reason is not None:
                    self._finish(sequence, updates[-1].finish_reason)
                continue
            if self._beams.is_beam(item.seq_id):
                beam_log_probs = samples[0].beam_log_probs
                if beam_log_probs is None:
                    raise ValueError(f"runner returned no beam log-probabilities for beam sequence {item.seq_id}")
                beam_rows[item.seq_id] = beam_log_probs
                continue
            if len(samples) != item.num_samples:
                raise ValueError(f"runner returned {len(samples)} samples for sequence {item.seq_id}, expected {item.num_samples}")
            family = [sequence] + self._fork(sequence, len(samples) - 1)
            for member, sample in zip(family, samples):
                added, reason = member.append_sample(sample)
                updates.append(
                    SequenceUpdate(
                        seq_id=member.seq_id,
                        request_id=member.request_id,
                        sample_index=member.sample_index,
                        new_token_ids=added,
                        new_samples=(sample,) if added else (),
                        finish_reason=reason,
                    )
                )
                if reason is not None:
                    self._finish(member, reason)
        for group, step in self._beams.step(beam_rows):
            if step.done:
                updates += finish_beams(group, [self._sequences[i] for i in group.member_ids], self._finish)
                continue
            if len(group.member_ids) < group.width:  # the prompt's step: fork it into the beams
                for child in self._fork(self._sequences[group.member_ids[0]], group.width - 1):
                    self._beams.add_member(group, child.seq_id)
            members = [self._sequences[i] for i in group.member_ids]
            reassign_beams(self._kv, group, members, step)
            updates += running_beam_updates(group, members)
        return updates

    # -- internals -------------------------------------------------------------------------
    def _fork(self, parent: Sequence, num_children: int) -> list[Sequence]:
        children = []
        for offset in range(1, num_children + 1):
            child = parent.fork(next(self._seq_ids), parent.sample_index + offset)
            self._kv.fork(parent.seq_id, child.seq_id)
            self._sequences[child.seq_id] = child
            self._seq_ids_by_request[parent.request_id].append(child.seq_id)
            self._running.insert(child)
            children.append(child)
        parent.num_pending_samples = 1
        return children

    def _finish(self, sequence: Sequence, reason: FinishReason) -> None:
        if sequence.is_finished:
            return
        was_running = self._running.remove(sequence)
        if not was_running:
            self._waiting.remove(sequence)
        self._policy.retire(sequence, was_running=was_running, aborted=reason is FinishReason.ABORTED)
        sequence.status = SequenceStatus.FINISHED
        sequence.finish_reason = reason
        self._beams.forget(sequence.seq_id)
        del self._sequences[sequence.seq_id]
        siblings = self._seq_ids_by_request.get(sequence.request_id, [])
        if sequence.seq_id in siblings:
            siblings.remove(sequence.seq_id)
        if not siblings:
            self._seq_ids_by_request.pop(sequence.request_id, None)
        self._finished_since_last_step.append(sequence.seq_id)

    def _make_output(self, plan: StepPlan) -> SchedulerOutput:
        scheduled = []
        for choice in plan.choices:
            sequence = choice.sequence
            if choice.padding:
                scheduled.append(padding_row(sequence, choice.block_table))
                self._num_padding_tokens += 1
                continue
            self._num_prefix_cache_hit_tokens += choice.num_cached_tokens
            self._num_prefix_cache_hits += choice.num_cached_tokens > 0
            start = sequence.num_computed_tokens
            end = start + choice.num_new_tokens
            self._num_prompt_tokens_computed += max(0, min(end, sequence.num_prompt_tokens) - start)
            scheduled.append(scheduled_sequence(sequence, start, end, choice.block_table))
            sequence.num_computed_tokens = end
        finished, self._finished_since_last_step = self._finished_since_last_step, []
        return SchedulerOutput(
            step_id=next(self._step_ids),
            scheduled=tuple(scheduled),
            block_copies=tuple(self._kv.take_block_copies()),
            preempted_seq_ids=tuple(s.seq_id for s in plan.preempted),
            finished_seq_ids=tuple(finished),
        )
