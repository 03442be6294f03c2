"""EAGLE (build.speculative.mode eagle): a trained draft layer. Two generations by target (TargetTraits.
eagle_generation): EAGLE-3 on llmapi (a chain of max_draft_len tokens, Eagle3DecodingConfig) and EAGLE-1/2 on the
engine target (a tree of eagle_choices, the draft layer merged into the model's checkpoint by
pipeline.backends.engine.eagle_checkpoint, num_eagle_layers the tree's depth)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.config.spec import SpeculativeMode
from pipeline.config.targets import traits_of
from pipeline.speculative.base import HeadsCheckpoint
from pipeline.speculative.trees import TreeModeRules
from refengine.speculative.medusa_tree import tree_depth

if TYPE_CHECKING:
    from pipeline.config.spec import BuildSpec, SpeculativeSpec

# Eagle3DecodingConfig's decoding_type in TensorRT-LLM 1.2's SpeculativeConfig union
EAGLE3 = "Eagle3"


def _tree_target(build: BuildSpec) -> bool:
    return traits_of(build.target).eagle_generation == "EAGLE-1/2"


class Eagle(TreeModeRules):
    mode = SpeculativeMode.eagle
    decoding_mode = "eagle"

    def drafts(self, build: BuildSpec) -> str:
        eagle = build.speculative.eagle if build.speculative is not None else None
        if eagle is None:
            return ""
        if not _tree_target(build):
            return f"an EAGLE-3 draft layer ({eagle.heads.name})"
        depth = tree_depth(eagle.tree)
        default = "" if eagle.choices is not None else ", NVIDIA's default mc_sim_7b_63"
        return f"an EAGLE-1/2 draft layer ({eagle.heads.name}): a tree of {len(eagle.tree)} nodes, {depth} deep{default} (num_eagle_layers {depth})"

    def served_tree(self, build: BuildSpec) -> list[list[int]] | None:
        eagle = build.speculative.eagle if build.speculative is not None else None
        return eagle.tree if eagle is not None and _tree_target(build) else None

    def engine_added_tokens(self, build: BuildSpec) -> int:
        # trtllm-build adds an EAGLE engine's num_eagle_layers to max_seq_len too (tensorrt_llm/builder.py)
        tree = self.served_tree(build)
        return tree_depth(tree) if tree else 0

    def num_eagle_layers(self, speculative: SpeculativeSpec) -> int:
        return tree_depth(speculative.eagle.tree) if speculative.eagle is not None else 0

    def tree_spec(self, speculative: SpeculativeSpec) -> Any | None:
        return speculative.eagle

    def heads_checkpoint(self, speculative: SpeculativeSpec) -> HeadsCheckpoint | None:
        if speculative.eagle is None:
            return None
        return HeadsCheckpoint(
            dir_name="eagle_checkpoint",
            heads=speculative.eagle.heads,
            what=f"a tree of {len(speculative.eagle.tree)} nodes",
            module="pipeline.backends.engine.eagle_checkpoint",
            write="write_eagle_checkpoint",
            options={"choices": speculative.eagle.tree, "max_draft_len": speculative.draft_len},
        )

    def llmapi_config(self, speculative: SpeculativeSpec) -> dict[str, Any] | str | None:
        # the user's EAGLE-3 draft checkpoint, linked like a draft model's (with_draft_model_dir)
        one_model = speculative.eagle.one_model if speculative.eagle is not None else None
        return {"decoding_type": EAGLE3, "max_draft_len": speculative.max_draft_len, "eagle3_one_model": one_model}


RULES = Eagle()
