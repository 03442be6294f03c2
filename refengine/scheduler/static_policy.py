"""Static batching's step (`EngineConfig.batching="static"`; see `static_batch.py`).

A `BatchingPolicy` over the scheduler's queues and KV cache; it holds the batch's padding rows
(finished sequences kept, and computed, until the batch ends) itself.
"""

from __future__ import annotations

from collections.abc import Callable

from refengine.config import EngineConfig
from refengine.kv_cache import CachedPrefix, KVCacheManager
from refengine.scheduler.admission_order import admission_order
from refengine.scheduler.choice import Choice
from refengine.scheduler.policy import StepPlan, tokens_to_schedule
from refengine.scheduler.queue import SequenceQueue
from refengine.scheduler.sequence import Sequence
from refengine.scheduler.static_batch import allocate_reserved, form_batch, release_padding_rows


class StaticBatching:
    def __init__(
        self,
        config: EngineConfig,
        kv: KVCacheManager,
        waiting: SequenceQueue,
        running: SequenceQueue,
        has_request: Callable[[str], bool],
    ) -> None:
        """`has_request`: whether a request still has unfinished sequences (its padding rows' blocks count for it)."""
        self._config = config
        self._kv = kv
        self._waiting = waiting
        self._running = running
        self._has_request = has_request
        self._padding_rows = SequenceQueue()  # finished rows held until the batch ends

    @property
    def num_padding_rows(self) -> int:
        return len(self._padding_rows)

    def retire(self, sequence: Sequence, was_running: bool, aborted: bool) -> None:
        """A finished member keeps its slot and blocks until the batch ends (an aborted one leaves)."""
        if was_running and not aborted:
            self._padding_rows.insert(sequence)
        else:
            self._kv.free(sequence.seq_id)
        if not self._running:
            release_padding_rows(self._kv, self._padding_rows)  # the batch's longest request has ended

    def schedule(self, step: int) -> StepPlan:
        """One step of a held batch (a new one formed first when none is held; see `form_batch`). Prompts first (whole, or chunked only as the budget
        requires), so that rows held in the batch cannot starve a prompt still to run; then one
        token for every decoding member and every padding row."""
        if not self._running:
            release_padding_rows(self._kv, self._padding_rows)  # normally none left: the last finish released them
            order = admission_order(self._config, self._kv, self._waiting, step)
            form_batch(self._kv, order, self._waiting, self._running, self._config.max_batch_size)
        budget = self._config.max_num_tokens
        choices: list[Choice] = []
        decoding = []
        for sequence in self._running:
            fresh = not self._kv.has_sequence(sequence.seq_id)
            if sequence.num_uncomputed_tokens == 1 and not fresh:
                decoding.append(sequence)
                continue
            prefix = self._kv.find_cached_prefix(sequence.cacheable_token_ids, sequence.prefix_salt) if fresh else CachedPrefix()
            num_new = tokens_to_schedule(self._config, sequence.num_uncomputed_tokens - prefix.num_tokens, budget)
            if num_new == 0:
                continue
            total = sequence.num_computed_tokens + prefix.num_tokens + num_new
            table = self._allocate_reserved(sequence, total, prefix)
            sequence.num_computed_tokens += prefix.num_tokens
            choices.append(Choice(sequence, num_new, table, num_cached_tokens=prefix.num_tokens))
            budget -= num_new
        for sequence in decoding:
            if budget > 0:
                choices.append(Choice(sequence, 1, self._allocate_reserved(sequence, sequence.num_tokens)))
                budget -= 1
        for sequence in self._padding_rows:
            if budget > 0:  # rewrites its slot after the frozen tokens: within its reservation
                table = self._allocate_reserved(sequence, sequence.num_computed_tokens + 1)
                choices.append(Choice(sequence, 1, table, padding=True))
                budget -= 1
        choices.sort(key=lambda choice: choice.sequence.sort_key)
        return StepPlan(choices)

    def _allocate_reserved(self, sequence: Sequence, num_total_tokens: int, prefix: CachedPrefix | None = None) -> tuple[int, ...]:
        owner = sequence.request_id if self._has_request(sequence.request_id) else None  # padding rows count for nobody
        return allocate_reserved(self._kv, sequence, num_total_tokens, prefix, owner)
