"""The rules of each speculative mode (build.speculative.mode → its module's RULES). A new mode is a SpeculativeMode
member, one module implementing base.SpeculativeModeRules, and one line here."""

from __future__ import annotations

import importlib
from functools import cache

from pipeline.config.spec import SpeculativeMode
from pipeline.errors import SpecError
from pipeline.speculative.base import SpeculativeModeRules

_MODULES: dict[SpeculativeMode, str] = {
    SpeculativeMode.draft_tokens_external: "pipeline.speculative.draft_target",
    SpeculativeMode.prompt_lookup: "pipeline.speculative.prompt_lookup",
    SpeculativeMode.lookahead_decoding: "pipeline.speculative.lookahead",
    SpeculativeMode.medusa: "pipeline.speculative.medusa",
    SpeculativeMode.eagle: "pipeline.speculative.eagle",
    SpeculativeMode.mtp: "pipeline.speculative.mtp",
}


def registered_modes() -> tuple[SpeculativeMode, ...]:
    return tuple(_MODULES)


@cache
def rules_for(mode: SpeculativeMode | str) -> SpeculativeModeRules:
    """The rules of `mode`; a mode the spec refuses (explicit_draft_tokens) has none."""
    module = _MODULES.get(SpeculativeMode(mode))
    if module is None:
        raise SpecError(f"build.speculative.mode {SpeculativeMode(mode).value} has no rules in this pipeline (pipeline/speculative/registry.py)")
    rules: SpeculativeModeRules = importlib.import_module(module).RULES
    return rules
