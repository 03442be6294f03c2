"""Draft-target (build.speculative.mode draft_tokens_external): a smaller draft model proposes, the model verifies
(TensorRT-LLM 1.2 examples/draft_target_model/README.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.config.spec import SpeculativeMode
from pipeline.speculative.base import ModeDefaults

if TYPE_CHECKING:
    from pipeline.backends.engine_facts import EngineFacts
    from pipeline.config.spec import BuildSpec, SpeculativeSpec

# DraftTargetDecodingConfig's discriminator: the Literal "Draft_Target" in TensorRT-LLM 1.2's SpeculativeConfig union
DRAFT_TARGET = "Draft_Target"


def draft_len_problems(facts: EngineFacts, speculative: SpeculativeSpec) -> list[str]:
    """A draft_tokens_external engine (draft-target or prompt lookup) against build.speculative."""
    problems = []
    if speculative.draft_len != facts.max_draft_len:
        problems.append(
            f"build.speculative.max_draft_len is {speculative.draft_len} but the engine has build_config.max_draft_len "
            f"{facts.max_draft_len}: requests are refused num_draft_tokens above the engine's"
        )
    if facts.max_beam_width > 1:
        problems.append(
            f"the engine has build_config.speculative_decoding_mode draft_tokens_external and build_config."
            f"max_beam_width {facts.max_beam_width}: draft-target decoding runs one beam"
        )
    return problems


class DraftTarget(ModeDefaults):
    mode = SpeculativeMode.draft_tokens_external

    def drafts(self, build: BuildSpec) -> str:
        draft = build.speculative.draft if build.speculative is not None else None
        return f"a draft model ({draft.source.name})" if draft else ""

    def consistency_problems(self, facts: EngineFacts, speculative: SpeculativeSpec) -> list[str]:
        return draft_len_problems(facts, speculative)

    def llmapi_config(self, speculative: SpeculativeSpec) -> dict[str, Any] | str | None:
        # speculative_model_dir (the draft's Hugging Face checkpoint; an alias of speculative_model) is added where the
        # served model directory is known (pipeline.backends.llmapi.options.with_draft_model_dir)
        return {"decoding_type": DRAFT_TARGET, "max_draft_len": speculative.max_draft_len}


RULES = DraftTarget()
