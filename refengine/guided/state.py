"""`GrammarState`: one sequence's position in its grammar.

Owned by the scheduler's `Sequence` (one state per sequence, created when the request is queued):
the scheduler asks it for the next-token mask when it schedules the sequence's sampling step and
puts the mask in the `ScheduledSequence`; the sampler only applies the mask (it never sees
xgrammar); `Sequence.append_sample` advances the state with the token drawn.

Preemption by recompute keeps a sequence's output tokens, so its state stays valid: nothing is
rolled back, and the recomputed sequence continues from the same mask.

Hooks for the other decoders (call them; never reach into the matcher):
- `n` > 1: the one sequence that draws n first tokens is forked before each sample is accepted,
  so every sample gets `fork()` of the state the mask was computed from.
- beam search (`guided.beams.follow_parents`): every beam owns a state; the mask of a beam is
  `allowed_next()`, applied to that beam's row before the top-k over beams; when beams are
  re-ranked, each beam takes its parent's state (`fork()` of it when several beams continue the
  same parent: 13 us, against 192 us to replay a 48-token beam into a new matcher; BENCHMARKS.md)
  and `accept`s its new token. A beam whose token the grammar refuses (only possible for a candidate scored -inf,
  picked because fewer valid ones existed) becomes `dead()`: it allows nothing, so it stays -inf.
- speculative decoding (`guided.drafts.constrain_draft`): draft tokens are accepted one by one,
  the mask after each recorded, stopping at the first the grammar refuses (that draft token and
  those after it are dropped, as a mismatch with the target would drop them); then `rollback`
  undoes them all, and the tokens verification keeps are accepted as any sampled token. A draft
  model drafts under `fork()` of the state (speculative/draft_model.py).
"""

from __future__ import annotations

import time
from typing import Any

import torch

_BIT_POSITIONS = torch.arange(32, dtype=torch.int32)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """xgrammar's packed int32 bitmask [1, ceil(V / 32)] as a bool vector [vocab_size]."""
    bits = (bitmask.reshape(-1, 1) >> _BIT_POSITIONS) & 1
    return bits.reshape(-1)[:vocab_size].to(torch.bool)


class GrammarState:
    def __init__(self, matcher: Any, vocab_size: int, timing: Any) -> None:
        import xgrammar

        self._xgrammar = xgrammar
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._timing = timing  # shared counters of mask cost (compiler._MaskTiming)
        self._stop_token_ids = tuple(matcher.stop_token_ids)
        self._allowed: torch.Tensor | None = None  # mask of the next position, computed once per position
        self._dead = False  # a beam that took a token the grammar refuses (see `dead`)

    # -- queries ---------------------------------------------------------------------------
    def allowed_next(self) -> torch.Tensor:
        """Tokens the grammar allows at the next position: bool [vocab] (stop tokens included once
        the grammar is complete). Computed once per position."""
        vocab_size = self._vocab_size
        if self._allowed is None and (self._dead or self._matcher.is_terminated()):
            self._allowed = torch.zeros(vocab_size, dtype=torch.bool)  # nothing follows a stop token
        if self._allowed is None:
            started = time.perf_counter()
            bitmask = self._xgrammar.allocate_token_bitmask(1, vocab_size)
            self._matcher.fill_next_token_bitmask(bitmask)
            self._allowed = allowed_tokens(bitmask, vocab_size)
            self._timing.add(time.perf_counter() - started)
        return self._allowed

    def accepts(self, token_id: int) -> bool:
        """Whether the grammar allows `token_id` next (the state does not change)."""
        return bool(self.allowed_next()[token_id])

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self._stop_token_ids

    def is_stop_token(self, token_id: int) -> bool:
        return token_id in self._stop_token_ids

    @property
    def is_terminated(self) -> bool:
        """A stop token was accepted: the output is complete."""
        return bool(self._matcher.is_terminated())

    def allows_only_stop(self) -> bool:
        """The output is complete and nothing may follow it: the generation ends here."""
        if not self._matcher.is_completed():
            return False
        allowed = self.allowed_next().clone()
        allowed[list(self._stop_token_ids)] = False
        return not bool(allowed.any())

    # -- changes ---------------------------------------------------------------------------
    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar refuses it."""
        if self._dead or self._matcher.is_terminated():
            return False
        accepted = bool(self._matcher.accept_token(token_id))
        if accepted:
            self._allowed = None
        return accepted

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (speculative drafts the target rejected)."""
        if num_tokens > 0:
            self._matcher.rollback(num_tokens)
            self._allowed = None

    def fork(self) -> GrammarState:
        """An independent copy at the same position (n > 1 samples, beams)."""
        copy = GrammarState(self._matcher.fork(), self._vocab_size, self._timing)
        copy._allowed = self._allowed
        copy._dead = self._dead
        return copy

    def dead(self) -> GrammarState:
        """This state, allowing no token from now on (a beam that left the grammar; see beams.py)."""
        self._dead = True
        self._allowed = None
        return self
