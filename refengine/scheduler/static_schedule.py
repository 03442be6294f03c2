"""Static batching's step (see `static_batch.py`), as a part of `Scheduler`.

Kept apart from the inflight loop so that each file stays readable; it reads and changes the
scheduler's own state (`_running`, `_waiting`, `_padding_rows`, `_kv`) and makes its output with
the scheduler's `_make_output`.
"""

from __future__ import annotations

from refengine.kv_cache import CachedPrefix
from refengine.scheduler.choice import Choice
from refengine.scheduler.sequence import Sequence
from refengine.scheduler.static_batch import allocate_reserved, form_batch, release_padding_rows
from refengine.step_messages import SchedulerOutput


class StaticScheduling:
    def _schedule_static(self) -> SchedulerOutput:
        """One step of a held batch. Prompts first (whole, or chunked only as the budget
        requires), so that rows held in the batch cannot starve a prompt still to run; then one
        token for every decoding member and every padding row."""
        if not self._running:
            release_padding_rows(self._kv, self._padding_rows)  # normally none left: the last finish released them
            form_batch(self._kv, self._waiting, self._running, self._config.max_batch_size)
        budget = self._config.max_num_tokens
        choices: list[Choice] = []
        decoding = []
        for sequence in self._running:
            fresh = not self._kv.has_sequence(sequence.seq_id)
            if sequence.num_uncomputed_tokens == 1 and not fresh:
                decoding.append(sequence)
                continue
            prefix = self._kv.find_cached_prefix(sequence.cacheable_token_ids, sequence.prefix_salt) if fresh else CachedPrefix()
            num_new = self._num_tokens_to_schedule(sequence.num_uncomputed_tokens - prefix.num_tokens, budget)
            if num_new == 0:
                continue
            total = sequence.num_computed_tokens + prefix.num_tokens + num_new
            table = self._allocate_reserved(sequence, total, prefix)
            sequence.num_computed_tokens += prefix.num_tokens
            self._num_prefix_cache_hit_tokens += prefix.num_tokens
            self._num_prefix_cache_hits += prefix.num_tokens > 0
            choices.append(Choice(sequence, num_new, table))
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
                self._num_padding_tokens += 1
        choices.sort(key=lambda choice: choice.sequence.sort_key)
        return self._make_output(choices, [])

    def _allocate_reserved(
        self, sequence: Sequence, num_total_tokens: int, prefix: CachedPrefix | None = None
    ) -> tuple[int, ...]:
        owner = sequence.request_id if self.has_request(sequence.request_id) else None  # padding rows count for nobody
        return allocate_reserved(self._kv, sequence, num_total_tokens, prefix, owner)
