"""One request's beam search, step by step, as Hugging Face `generate(num_beams=B, do_sample=False)`.

Each step takes the B running beams' processed log-probability rows [B, vocab] and returns which
running beam each of the next B beams continues and with which token. The arithmetic is
transformers' (`GenerationMixin._beam_search`, 4.50+ vectorised form), in float32 and with the
same `torch.topk` calls on tensors of the same shapes, so ties break the same way:

- candidates: the top K = max(2, 1 + number of end ids) * B of (beam score + log-prob) over all
  B * vocab continuations; at the first step only beam 0 is live (the others start at -1e9);
- a candidate "hits" if its token is an end id (`end_id`, and with guided decoding the grammar's
  stop tokens: `extra_end_ids`), its generated tokens end with a stop sequence (`stop_sequences`,
  TensorRT-LLM's stop words; once `min_new_tokens` are generated, as without beams; transformers
  checks a stopping criterion per candidate the same way, and it does not widen K) or the sequence
  reaches prompt + max_tokens;
- running beams: the best B candidates that did not hit;
- finished beams: the best B of (kept finished, candidates among the first B that hit), a
  candidate scored cum_log_prob / generated_length ** length_penalty (its end token counted);
- early_stopping True: done once B beams finished; False: done once the best running beam,
  normalised at the current length, cannot beat the worst finished one; "never": the same test
  with the longest possible length when length_penalty > 0.

Invariant: `running_tokens` and `running_scores` have B entries; `finished` has B entries sorted
by score, best first (entries not yet filled have score -1e9 and no tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refengine.sampling import ends_with_stop_sequence

_NEG = -1.0e9


@dataclass(frozen=True)
class Beam:
    """A beam's generated tokens (an end id that finished it excluded; a stop sequence kept), their
    log-probabilities, the sum of those (end token included: `cum_log_prob`) and the normalised score."""

    token_ids: tuple[int, ...]
    token_log_probs: tuple[float, ...]
    cum_log_prob: float
    score: float
    finished: bool
    stopped: bool  # finished by an end id or a stop sequence (else by length)


@dataclass(frozen=True)
class BeamStep:
    parents: tuple[int, ...]  # next running beam i continues running beam parents[i]
    tokens: tuple[int, ...]  # ... with this token
    done: bool


class BeamSearch:
    def __init__(
        self,
        beam_width: int,
        *,
        prompt_len: int,
        max_new_tokens: int,
        length_penalty: float = 1.0,
        early_stopping: bool | str = False,
        end_id: int | None = None,
        extra_end_ids: tuple[int, ...] = (),
        stop_sequences: tuple[tuple[int, ...], ...] = (),
        min_new_tokens: int = 0,
    ) -> None:
        self.beam_width = beam_width
        self._prompt_len = prompt_len
        self._max_length = prompt_len + max_new_tokens
        self._length_penalty = length_penalty
        self._early_stopping = early_stopping
        self._end_ids = tuple(dict.fromkeys(((end_id,) if end_id is not None else ()) + tuple(extra_end_ids)))
        self._num_candidates = max(2, 1 + len(self._end_ids)) * beam_width
        self._stop_sequences = tuple(tuple(stop) for stop in stop_sequences if stop)
        self._min_new_tokens = min_new_tokens
        self._cur_len = prompt_len
        self.running_scores = torch.zeros((1, beam_width), dtype=torch.float32)
        self.running_scores[:, 1:] = _NEG
        self.running_tokens: list[tuple[int, ...]] = [() for _ in range(beam_width)]
        self._running_log_probs: list[tuple[float, ...]] = [() for _ in range(beam_width)]
        self._finished_scores = torch.full((1, beam_width), _NEG, dtype=torch.float32)
        self._is_finished = torch.zeros((1, beam_width), dtype=torch.bool)
        self._finished: list[tuple[tuple[int, ...], tuple[float, ...], float]] = [((), (), 0.0)] * beam_width
        self._improvable = torch.ones((1, 1), dtype=torch.bool)
        self.done = False

    @property
    def num_generated(self) -> int:
        return self._cur_len - self._prompt_len

    def step(self, log_probs: torch.Tensor) -> BeamStep:
        """`log_probs`: [B, vocab] float32 processed log-probabilities of the running beams (at the
        first step one row, the prompt's, which every beam shares)."""
        if self.done:
            raise RuntimeError("beam search already finished")
        width = self.beam_width
        if log_probs.shape[0] == 1 and width > 1:
            log_probs = log_probs.expand(width, -1)
        vocab = log_probs.shape[-1]
        accumulated = (log_probs + self.running_scores[0, :, None]).reshape(1, width * vocab)
        top_scores, top_indices = torch.topk(accumulated, k=min(self._num_candidates, width * vocab))
        parents = top_indices // vocab
        tokens = top_indices % vocab
        candidates = [self._extend(int(p), int(t), float(log_probs[int(p), int(t)])) for p, t in zip(parents[0], tokens[0])]
        hits = self._hits(tokens, candidates)

        running = top_scores + hits.to(torch.float32) * _NEG
        order = torch.topk(running, k=width)[1][0]
        self.running_scores = running[:, order]
        self.running_tokens = [candidates[int(i)][0] for i in order]
        self._running_log_probs = [candidates[int(i)][1] for i in order]

        self._update_finished(candidates, top_scores, hits)
        self._cur_len += 1
        self._update_improvable()
        open_beam = not (bool(self._is_finished.all()) and self._early_stopping is True)
        self.done = not (bool(self._improvable.any()) and open_beam and not bool(hits.all()))
        return BeamStep(
            parents=tuple(int(parents[0, i]) for i in order),
            tokens=tuple(int(tokens[0, i]) for i in order),
            done=self.done,
        )

    @property
    def running_log_probs(self) -> list[tuple[float, ...]]:
        """Each running beam's token log-probabilities, in `running_tokens` order."""
        return self._running_log_probs

    def best(self, num: int) -> list[Beam]:
        """The `num` best finished beams, best first (after `done`)."""
        beams = []
        for index in range(num):
            tokens, log_probs, cum = self._finished[index]
            finished = bool(self._is_finished[0, index])
            ended = finished and bool(tokens) and tokens[-1] in self._end_ids
            if ended:
                tokens, log_probs = tokens[:-1], log_probs[:-1]
            stopped = ended or (finished and ends_with_stop_sequence(tokens, self._stop_sequences))
            beams.append(Beam(tokens, log_probs, cum, float(self._finished_scores[0, index]), finished, stopped))
        return beams

    # -- internals -------------------------------------------------------------------------
    def _extend(self, parent: int, token: int, log_prob: float) -> tuple[tuple[int, ...], tuple[float, ...]]:
        return self.running_tokens[parent] + (token,), self._running_log_probs[parent] + (log_prob,)

    def _hits(self, tokens: torch.Tensor, candidates: list[tuple[tuple[int, ...], tuple[float, ...]]]) -> torch.Tensor:
        at_length = self._cur_len + 1 >= self._max_length
        hits = torch.full(tokens.shape, at_length, dtype=torch.bool)
        if self._end_ids:
            hits |= torch.isin(tokens, torch.tensor(self._end_ids, dtype=tokens.dtype))
        if self._stop_sequences and self._cur_len + 1 - self._prompt_len >= self._min_new_tokens:
            hits |= torch.tensor([[ends_with_stop_sequence(generated, self._stop_sequences) for generated, _ in candidates]], dtype=torch.bool)
        return hits

    def _update_finished(self, candidates: list[tuple[tuple[int, ...], tuple[float, ...]]], top_scores: torch.Tensor, hits: torch.Tensor) -> None:
        width = self.beam_width
        top_mask = torch.zeros(hits.shape[-1], dtype=torch.bool)
        top_mask[:width] = True
        just_finished = hits & top_mask[None, :]
        scores = top_scores / ((self._cur_len + 1 - self._prompt_len) ** self._length_penalty)
        full = bool(self._is_finished.all()) and self._early_stopping is True
        scores = scores + float(full) * _NEG
        scores = scores + (~self._improvable).to(torch.float32) * _NEG
        scores = scores + (~just_finished) * _NEG
        merged_scores = torch.cat((self._finished_scores, scores), dim=1)
        merged_finished = torch.cat((self._is_finished, just_finished), dim=1)
        merged = self._finished + [(tokens, log_probs, float(top_scores[0, i])) for i, (tokens, log_probs) in enumerate(candidates)]
        keep = torch.topk(merged_scores, k=width)[1][0]
        self._finished_scores = merged_scores[:, keep]
        self._is_finished = merged_finished[:, keep]
        self._finished = [merged[int(i)] for i in keep]

    def _update_improvable(self) -> None:
        if self._early_stopping == "never" and self._length_penalty > 0.0:
            length = self._max_length - self._prompt_len
        else:
            length = self._cur_len - self._prompt_len
        best_running = self.running_scores[:, :1] / (length**self._length_penalty)
        worst_finished = torch.where(self._is_finished, torch.min(self._finished_scores, dim=1, keepdim=True)[0], _NEG)
        self._improvable = self._improvable & torch.any(best_running > worst_finished, dim=-1, keepdim=True)
