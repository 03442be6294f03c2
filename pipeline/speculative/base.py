"""What differs between speculative decoding modes (build.speculative.mode), as one protocol: the plan summary's
words, the Triton parameters, the consistency checks of a rendered repository against the engine, the engine's build
settings, the checkpoint that merges trained heads into the model's, and the LLM() speculative_config. Methods return
plain data; callers ask the mode's rules (pipeline.speculative.registry.rules_for) instead of comparing modes.

The spec's own checks of a mode (its section, max_draft_len) run when the spec loads, in pipeline.config, the layer
below this one: they stay with the spec models there."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pipeline.backends.engine_facts import EngineFacts
    from pipeline.config.spec import BuildSpec, SpeculativeMode, SpeculativeSpec


@dataclass(frozen=True)
class HeadsCheckpoint:
    """The checkpoint trtllm-build reads for a mode whose trained heads are merged into the model's: the directory
    name beside the engine, the heads, a few words for the log, the writer's module (with `command` for a dry run and
    the function named `write`), and the writer's keyword options."""

    dir_name: str
    heads: Path
    what: str
    module: str
    write: str
    options: dict[str, Any] = field(default_factory=dict)


class SpeculativeModeRules(Protocol):
    """One speculative mode's rules; registry.py holds one per SpeculativeMode member."""

    mode: SpeculativeMode

    def drafts(self, build: BuildSpec) -> str:
        """What drafts the tokens, for `plan`'s summary line ("drafts from …")."""
        ...

    def served_tree(self, build: BuildSpec) -> list[list[int]] | None:
        """The tree of candidates Triton's tensorrt_llm model is given (its <mode>_choices), or None."""
        ...

    def engine_added_tokens(self, build: BuildSpec) -> int:
        """Tokens trtllm-build adds to max_seq_len besides max_draft_len (EAGLE-1/2: num_eagle_layers)."""
        ...

    def num_eagle_layers(self, speculative: SpeculativeSpec) -> int:
        """The engine's --num_eagle_layers build setting (0 but for EAGLE)."""
        ...

    def triton_parameters(self, facts: EngineFacts, speculative: SpeculativeSpec) -> dict[str, str]:
        """The tensorrt_llm model's decoding parameters for an engine built in this mode."""
        ...

    def consistency_problems(self, facts: EngineFacts, speculative: SpeculativeSpec) -> list[str]:
        """What in the engine disagrees with build.speculative (the engine's mode already equals the spec's)."""
        ...

    def heads_checkpoint(self, speculative: SpeculativeSpec) -> HeadsCheckpoint | None:
        """The merged checkpoint trtllm-build reads instead of the quantize stage's, or None (read that as is)."""
        ...

    def llmapi_config(self, speculative: SpeculativeSpec) -> dict[str, Any] | str | None:
        """LLM()'s speculative_config on the llmapi target; a string: why TensorRT-LLM's PyTorch backend refuses the
        mode; None: this version renders none for it."""
        ...


class ModeDefaults:
    """What most modes share: no tree, no heads checkpoint, nothing added to the engine, no Triton parameters."""

    def served_tree(self, build: BuildSpec) -> list[list[int]] | None:
        return None

    def engine_added_tokens(self, build: BuildSpec) -> int:
        return 0

    def num_eagle_layers(self, speculative: SpeculativeSpec) -> int:
        return 0

    def triton_parameters(self, facts: EngineFacts, speculative: SpeculativeSpec) -> dict[str, str]:
        return {}

    def heads_checkpoint(self, speculative: SpeculativeSpec) -> HeadsCheckpoint | None:
        return None

    def llmapi_config(self, speculative: SpeculativeSpec) -> dict[str, Any] | str | None:
        return None
