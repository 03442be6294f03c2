"""The batching policy: what one step schedules (`EngineConfig.batching`).

The `Scheduler` owns the requests, their sequences, the two queues and the KV cache; a policy
is handed the queues and the cache it works on when it is made, and each step returns a
`StepPlan`: which sequences compute how many tokens (`Choice`), and which it preempted. It may
move sequences between the queues as it goes (admission, preemption, forming a static batch);
the scheduler then turns the plan into the step's `SchedulerOutput`. When a sequence finishes,
the policy decides what becomes of its blocks (`retire`).

Two policies: `InflightBatching` (`inflight_policy.py`), TensorRT-LLM's inflight fused
batching, and `StaticBatching` (`static_policy.py`), its V1 static batching. The admission rule
within them (guaranteed_no_evict or max_utilization) is `EngineConfig.scheduler_policy`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from refengine.config import EngineConfig
from refengine.scheduler.choice import Choice
from refengine.scheduler.sequence import Sequence


@dataclass
class StepPlan:
    """One step as a policy schedules it, in the order the step computes it."""

    choices: list[Choice] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)  # moved back to the waiting queue this step


class BatchingPolicy(Protocol):
    def schedule(self, step: int) -> StepPlan:
        """The plan of scheduler step `step` (0, 1, ...: a waiting sequence's age is counted in these); admits, preempts
        or forms a batch on the way."""
        ...

    def retire(self, sequence: Sequence, was_running: bool, aborted: bool) -> None:
        """`sequence` finished and has left the queues: free its blocks, or hold them."""
        ...

    @property
    def num_padding_rows(self) -> int:
        """Finished sequences still held (and computed) in the running batch (static batching; else 0)."""
        ...


def tokens_to_schedule(config: EngineConfig, remaining: int, budget: int) -> int:
    """All `remaining` tokens if the budget allows, else a chunk (if allowed) or nothing.

    Without chunked context a sequence longer than max_num_tokens (possible only when it
    recomputes prompt + output after preemption) is still chunked, or it could never run.
    """
    chunkable = config.enable_chunked_context or remaining > config.max_num_tokens
    if remaining <= budget:
        return remaining
    return budget if chunkable else 0
