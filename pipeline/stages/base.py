"""What a stage receives: its slice of the world, and one directory to write into."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from pipeline.artifacts import ArtifactRef
from pipeline.config.model_info import ModelInfo
from pipeline.config.spec import Spec
from pipeline.plan import StagePlan


def _no_history() -> tuple[ArtifactRef, ...]:
    return ()


@dataclass(frozen=True)
class StageContext:
    spec: Spec  # a SpecSlice (StageDef.spec_slice): the Spec paths plan.STAGE_DEFS declares for this stage, and no others
    model: ModelInfo
    plan: StagePlan
    upstream: dict[str, ArtifactRef]
    out_dir: Path
    console: Console
    notes: dict[str, Any] = field(default_factory=dict)  # stored in the artifact's manifest
    final_dir: Path | None = None  # where out_dir will be renamed to once the stage succeeds
    # this build's sealed artifacts of this stage (any digest), verified, oldest first: ArtifactStore.history
    history: Callable[[], tuple[ArtifactRef, ...]] = _no_history

    def log(self, message: str) -> None:
        self.console.print(f"  [dim]{self.plan.name}:[/dim] {message}")


StageFn = Callable[[StageContext], None]
