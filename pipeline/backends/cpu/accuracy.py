"""Perplexity and next-token agreement of a checkpoint vs a baseline, computed with refengine on CPU."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class AccuracyMetrics:
    baseline_perplexity: float
    perplexity: float
    token_agreement: float
    num_windows: int
    tokens_scored: int

    @property
    def perplexity_increase_pct(self) -> float:
        return 100.0 * (self.perplexity - self.baseline_perplexity) / self.baseline_perplexity


def compare_checkpoints(baseline_dir: Path, candidate_dir: Path, windows: Sequence[Sequence[int]]) -> AccuracyMetrics:
    from refengine.checkpoint import load_checkpoint
    from refengine.model_runner import load_model
    from refengine.scoring import perplexity, score_sequences

    baseline = score_sequences(load_model(load_checkpoint(baseline_dir)), windows)
    candidate = score_sequences(load_model(load_checkpoint(candidate_dir)), windows)
    agree = sum(int((b.predictions == c.predictions).sum()) for b, c in zip(baseline, candidate))
    total = sum(len(score.predictions) for score in baseline)
    return AccuracyMetrics(perplexity(baseline), perplexity(candidate), agree / total, len(windows), total)
