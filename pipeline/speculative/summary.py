"""One line for `plan` about build.speculative: the mode, what drafts (the tree's size for Medusa) and what the engine
needs for it (the draft tokens trtllm-build adds to max_seq_len and max_num_tokens, Triton's decoding parameters)."""

from __future__ import annotations

from pipeline.config.spec import BuildSpec
from pipeline.config.targets import traits_of
from pipeline.speculative.registry import rules_for
from refengine.speculative.medusa_tree import format_medusa_choices

_MAX_SHOWN_CHOICES = 60


def speculative_summary(build: BuildSpec) -> str | None:
    speculative = build.speculative
    if speculative is None:
        return None
    rules, k = rules_for(speculative.mode), speculative.draft_len
    line = f"speculative decoding: {speculative.mode.value}, drafts from {rules.drafts(build)}; max_draft_len {k}"
    if traits_of(build.target).follows_trtllm_plugin_rules:
        extra = k + rules.engine_added_tokens(build)
        line += (
            f"; the engine holds max_seq_len + {extra} tokens per sequence and max_num_tokens >= max_batch_size × {k + 1} = {build.max_batch_size * (k + 1)}"
        )
    tree = rules.served_tree(build)
    if tree is not None:
        text = format_medusa_choices(tree)
        shown = text if len(text) <= _MAX_SHOWN_CHOICES else text[:_MAX_SHOWN_CHOICES] + "…"
        line += f'; Triton decoding_mode {speculative.mode.value}, {speculative.mode.value}_choices "{shown}"'
    return line
