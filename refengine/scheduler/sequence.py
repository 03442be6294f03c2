"""A sequence: one sample of one request, as the scheduler tracks it.

A request asking for n samples starts as one sequence that will draw n tokens at the end of its
prompt; the scheduler then forks it into n sequences sharing the prompt's KV blocks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from refengine.priority import DEFAULT_PRIORITY
from refengine.sampling import SamplingParams, ends_with_stop_sequence
from refengine.step_messages import SampledToken

if TYPE_CHECKING:
    from refengine.guided.state import GrammarState
    from refengine.lora.adapter import LoraAdapter


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    LENGTH = "length"  # max_tokens reached
    STOP = "stop"  # end_id or a stop sequence
    ABORTED = "aborted"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    request_id: str
    sample_index: int
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    sampling_seed: int
    arrival_order: int
    num_pending_samples: int = 1  # > 1 until the first token is drawn and the sequence forked
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    num_draft_tokens: int = 0  # speculative decoding: draft tokens verified so far
    num_accepted_draft_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    grammar: GrammarState | None = None  # guided decoding: this sequence's own grammar position
    # Mixed into its prefix-cache hashes: sequences whose K/V differ for the same tokens (a long-RoPE model's long
    # prompts, another LoRA adapter) never share cached blocks with the others.
    prefix_salt: bytes = b""
    lora: LoraAdapter | None = None  # the request's LoRA adapter; None: the base model
    priority: float = DEFAULT_PRIORITY  # in [0, 1], higher first (refengine/priority.py)
    arrival_step: int = 0  # the scheduler steps run before the request arrived (its age, for the starvation guard)
    _token_ids: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not self._token_ids:
            self._token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)

    @property
    def token_ids(self) -> list[int]:
        """Prompt followed by the output so far (do not mutate)."""
        return self._token_ids

    @property
    def cacheable_token_ids(self) -> list[int]:
        """What a cached prefix may cover: nothing when every prompt position's logits are wanted."""
        return [] if self.params.return_context_logits else self._token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def max_total_tokens(self) -> int:
        """Tokens the sequence may hold when it finishes (prompt + max_tokens)."""
        return self.num_prompt_tokens + self.params.max_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def sort_key(self) -> tuple[float, int, int]:
        """Queue order: higher priority first, then first come first served (arrival, then sample index)."""
        return (-self.priority, self.arrival_order, self.sample_index)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def fork(self, seq_id: int, sample_index: int) -> Sequence:
        return Sequence(
            seq_id=seq_id,
            request_id=self.request_id,
            sample_index=sample_index,
            prompt_token_ids=self.prompt_token_ids,
            params=self.params,
            sampling_seed=self.sampling_seed,
            arrival_order=self.arrival_order,
            output_token_ids=list(self.output_token_ids),
            num_computed_tokens=self.num_computed_tokens,
            num_preemptions=self.num_preemptions,
            status=self.status,
            grammar=self.grammar.fork() if self.grammar is not None else None,
            prefix_salt=self.prefix_salt,
            lora=self.lora,
            priority=self.priority,
            arrival_step=self.arrival_step,
        )

    def replace_output(self, output_token_ids: tuple[int, ...]) -> None:
        """Beam search: this sequence now continues another beam (same length, other tokens)."""
        self.output_token_ids = list(output_token_ids)
        self._token_ids = list(self.prompt_token_ids) + self.output_token_ids

    def append_sample(self, sample: SampledToken) -> tuple[tuple[int, ...], FinishReason | None]:
        """Add a sampled token; returns (tokens added to the output, finish reason or None).

        `end_id` ends the sequence without joining the output; a stop sequence joins it. Guided: a
        grammar stop token (eos) ends it like `end_id`; a token after which the grammar allows
        nothing else ends it with STOP, and joins the output.
        """
        params = self.params
        grammar = self.grammar
        if grammar is not None and not grammar.accept(sample.token_id):
            raise RuntimeError(f"sequence {self.seq_id}: token {sample.token_id} was sampled against its grammar's mask")
        if grammar is not None and grammar.is_terminated:
            return (), FinishReason.STOP
        if params.end_id is not None and sample.token_id == params.end_id and (self.num_output_tokens >= params.min_tokens):
            return (), FinishReason.STOP
        self.output_token_ids.append(sample.token_id)
        self._token_ids.append(sample.token_id)
        if self.num_output_tokens >= params.min_tokens and ends_with_stop_sequence(self.output_token_ids, params.stop_token_ids):
            return (sample.token_id,), FinishReason.STOP
        if grammar is not None and grammar.allows_only_stop():
            return (sample.token_id,), FinishReason.STOP
        if self.num_output_tokens >= params.max_tokens:
            return (sample.token_id,), FinishReason.LENGTH
        return (sample.token_id,), None


@dataclass(frozen=True)
class SequenceUpdate:
    """What one step did to one sequence, for the engine to turn into request outputs."""

    seq_id: int
    request_id: str
    sample_index: int
    new_token_ids: tuple[int, ...] = ()
    new_samples: tuple[SampledToken, ...] = ()
    finish_reason: FinishReason | None = None
    num_draft_tokens: int = 0  # speculative decoding: drafts verified in this step, and accepted
    num_accepted_draft_tokens: int = 0
    cum_log_prob: float | None = None  # beam search: the returned beam's summed log-probability
    # Beam search: new_token_ids (and new_samples) are the beam's whole output so far, replacing what
    # the returned sequence held (a beam may continue another one from one step to the next).
    replaces_output: bool = False
