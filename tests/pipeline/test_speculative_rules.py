"""The speculative seam (docs/architecture.md#speculative-decoding-modes): every mode the spec accepts has its rules,
found through the registry, and a refused mode has none."""

from __future__ import annotations

import pytest

from pipeline.config.spec import SpeculativeMode
from pipeline.errors import SpecError
from pipeline.speculative.base import SpeculativeModeRules
from pipeline.speculative.registry import registered_modes, rules_for

PROTOCOL_METHODS = [name for name in vars(SpeculativeModeRules) if not name.startswith("_") and callable(getattr(SpeculativeModeRules, name))]


def test_every_accepted_mode_has_rules_of_its_own_mode() -> None:
    accepted = [mode for mode in SpeculativeMode if mode is not SpeculativeMode.explicit_draft_tokens]
    assert sorted(registered_modes()) == sorted(accepted)
    for mode in accepted:
        rules = rules_for(mode)
        assert rules.mode is mode
        assert all(callable(getattr(rules, name)) for name in PROTOCOL_METHODS)


def test_a_refused_mode_has_no_rules_and_the_error_names_it() -> None:
    with pytest.raises(SpecError, match="build.speculative.mode explicit_draft_tokens has no rules"):
        rules_for(SpeculativeMode.explicit_draft_tokens)
