"""Medusa (build.speculative.mode medusa): trained heads propose a tree of candidates, verified in one step; on the
engine target the heads are merged into the model's checkpoint (pipeline.backends.engine.medusa_checkpoint)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.config.spec import SpeculativeMode, Target
from pipeline.config.targets import traits_of
from pipeline.speculative.base import HeadsCheckpoint
from pipeline.speculative.trees import TreeModeRules
from refengine.speculative.medusa_tree import tree_depth

if TYPE_CHECKING:
    from pipeline.config.spec import BuildSpec, SpeculativeSpec


class Medusa(TreeModeRules):
    mode = SpeculativeMode.medusa
    decoding_mode = "medusa"

    def drafts(self, build: BuildSpec) -> str:
        medusa = build.speculative.medusa if build.speculative is not None else None
        if medusa is None:
            return ""
        tree = medusa.tree
        return f"Medusa heads: a tree of {len(tree)} nodes, {tree_depth(tree)} deep (reads heads 0..{tree_depth(tree) - 1})"

    def served_tree(self, build: BuildSpec) -> list[list[int]] | None:
        medusa = build.speculative.medusa if build.speculative is not None else None
        return medusa.tree if medusa is not None else None

    def tree_spec(self, speculative: SpeculativeSpec) -> Any | None:
        return speculative.medusa

    def heads_checkpoint(self, speculative: SpeculativeSpec) -> HeadsCheckpoint | None:
        if speculative.medusa is None:
            return None
        return HeadsCheckpoint(
            dir_name="medusa_checkpoint",
            heads=speculative.medusa.heads,
            what=f"{len(speculative.medusa.tree)} tree nodes",
            module="pipeline.backends.engine.medusa_checkpoint",
            write="write_medusa_checkpoint",
            options={"max_draft_len": speculative.draft_len},
        )

    def llmapi_config(self, speculative: SpeculativeSpec) -> dict[str, Any] | str | None:
        return traits_of(Target.llmapi).refused_speculative_modes["medusa"]


RULES = Medusa()
