"""MTP (build.speculative.mode mtp): the model's own multi-token-prediction layers draft (DeepSeek-V3 family; the
llmapi target's MTPDecodingConfig)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.config.spec import SpeculativeMode
from pipeline.speculative.base import ModeDefaults

if TYPE_CHECKING:
    from pipeline.backends.engine_facts import EngineFacts
    from pipeline.config.spec import BuildSpec, SpeculativeSpec


class Mtp(ModeDefaults):
    mode = SpeculativeMode.mtp

    def drafts(self, build: BuildSpec) -> str:
        layers = build.speculative.draft_len if build.speculative is not None else 0
        return f"the model's own MTP layers ({layers})"

    def consistency_problems(self, facts: EngineFacts, speculative: SpeculativeSpec) -> list[str]:
        return [
            f"the engine has build_config.speculative_decoding_mode {facts.speculative_decoding_mode}: this repository renders no ReDrafter parameters for it"
        ]

    def llmapi_config(self, speculative: SpeculativeSpec) -> dict[str, Any] | str | None:
        # NVIDIA sets max_draft_len to num_nextn_predict_layers
        return {"decoding_type": "MTP", "num_nextn_predict_layers": speculative.draft_len}


RULES = Mtp()
