"""What the two tree modes (Medusa, EAGLE-1/2) share: Triton's <mode>_choices parameter and the tree against the
engine's draft tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.speculative.base import ModeDefaults
from refengine.speculative.medusa_tree import format_medusa_choices, tree_depth

if TYPE_CHECKING:
    from pipeline.backends.engine_facts import EngineFacts
    from pipeline.config.spec import SpeculativeSpec


class TreeModeRules(ModeDefaults):
    """Triton parameters and consistency of a tree mode, read from its spec section (`tree_spec`), whose `tree` Triton
    gets when the engine's speculative_decoding_mode is `decoding_mode`."""

    decoding_mode: str

    def tree_spec(self, speculative: SpeculativeSpec) -> Any | None:
        raise NotImplementedError

    def triton_parameters(self, facts: EngineFacts, speculative: SpeculativeSpec) -> dict[str, str]:
        section = self.tree_spec(speculative)
        if facts.speculative_decoding_mode != self.decoding_mode or section is None:
            return {}
        return tree_parameters(self.decoding_mode, section.tree)

    def consistency_problems(self, facts: EngineFacts, speculative: SpeculativeSpec) -> list[str]:
        section = self.tree_spec(speculative)
        return tree_fits(facts, speculative, section.tree if section is not None else [])


def tree_parameters(mode: str, tree: list[list[int]]) -> dict[str, str]:
    """decoding_mode and the spec's tree, in NVIDIA's string form ("{0}, {0, 0}, {1}"): medusa_choices for a Medusa
    engine, eagle_choices for an EAGLE-1/2 engine (model_instance_state.cc passes it to executor::EagleConfig)."""
    return {"decoding_mode": mode, f"{mode}_choices": format_medusa_choices(tree)}


def tree_fits(facts: EngineFacts, speculative: SpeculativeSpec, tree: list[list[int]]) -> list[str]:
    """The tree Triton's medusa_choices / eagle_choices names must fit the engine's draft tokens (max_draft_len: its
    nodes), and an EAGLE engine's num_eagle_layers must be its depth."""
    problems = []
    if len(tree) > facts.max_draft_len:
        problems.append(
            f"build.speculative.{speculative.mode.value}.choices has {len(tree)} nodes but the engine has "
            f"build_config.max_draft_len {facts.max_draft_len}: a {speculative.mode.value} engine verifies at "
            "most max_draft_len nodes per step"
        )
    if facts.num_eagle_layers and tree and tree_depth(tree) != facts.num_eagle_layers:
        problems.append(
            f"build.speculative.eagle.choices is {tree_depth(tree)} deep but the engine has "
            f"pretrained_config.num_eagle_layers {facts.num_eagle_layers}: TensorRT-LLM's EAGLE needs every "
            "tree exactly as deep as num_eagle_layers (examples/eagle/README.md)"
        )
    return problems
