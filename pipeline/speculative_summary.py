"""One line for `plan` about build.speculative: the mode, what drafts (the tree's size for Medusa) and what the engine
needs for it (the draft tokens trtllm-build adds to max_seq_len and max_num_tokens, Triton's decoding parameters)."""

from __future__ import annotations

from pipeline.config.medusa_tree import choices_text, tree_depth
from pipeline.config.spec import BuildSpec, SpeculativeMode
from pipeline.config.targets import traits_of

_MAX_SHOWN_CHOICES = 60


def speculative_summary(build: BuildSpec) -> str | None:
    speculative = build.speculative
    if speculative is None:
        return None
    k, la = speculative.draft_len, speculative.lookahead
    drafts = {
        SpeculativeMode.draft_tokens_external: lambda: f"a draft model ({speculative.draft.source.name})" if speculative.draft else "",
        SpeculativeMode.prompt_lookup: lambda: f"n-grams of the request (up to {speculative.prompt_lookup.max_matching_ngram_size} tokens matched)",
        SpeculativeMode.lookahead_decoding: lambda: f"the engine's lookahead n-grams (W {la.window_size}, N {la.ngram_size}, G {la.verification_set_size})",
        SpeculativeMode.medusa: lambda: _medusa(speculative.medusa.tree) if speculative.medusa else "",
        SpeculativeMode.eagle: lambda: _eagle(build) if speculative.eagle else "",
        SpeculativeMode.mtp: lambda: f"the model's own MTP layers ({k})",
    }
    line = f"speculative decoding: {speculative.mode.value}, drafts from {drafts[speculative.mode]()}; max_draft_len {k}"
    tree = _served_tree(build)
    if traits_of(build.target).follows_trtllm_plugin_rules:
        # trtllm-build adds an EAGLE engine's num_eagle_layers to max_seq_len too (tensorrt_llm/builder.py)
        extra = k + (tree_depth(tree) if speculative.mode is SpeculativeMode.eagle and tree else 0)
        line += (
            f"; the engine holds max_seq_len + {extra} tokens per sequence and max_num_tokens >= max_batch_size × {k + 1} = {build.max_batch_size * (k + 1)}"
        )
    if tree is not None:
        text = choices_text(tree)
        shown = text if len(text) <= _MAX_SHOWN_CHOICES else text[:_MAX_SHOWN_CHOICES] + "…"
        line += f'; Triton decoding_mode {speculative.mode.value}, {speculative.mode.value}_choices "{shown}"'
    return line


def _served_tree(build: BuildSpec) -> list[list[int]] | None:
    """The tree Triton's tensorrt_llm model is given: Medusa's, or the EAGLE-1/2 engine's."""
    speculative = build.speculative
    if speculative.mode is SpeculativeMode.medusa and speculative.medusa is not None:
        return speculative.medusa.tree
    if speculative.mode is SpeculativeMode.eagle and speculative.eagle is not None and _eagle_tree(build):
        return speculative.eagle.tree
    return None


def _eagle_tree(build: BuildSpec) -> bool:
    return traits_of(build.target).eagle_generation == "EAGLE-1/2"


def _eagle(build: BuildSpec) -> str:
    eagle = build.speculative.eagle
    if not _eagle_tree(build):
        return f"an EAGLE-3 draft layer ({eagle.heads.name})"
    depth = tree_depth(eagle.tree)
    default = "" if eagle.choices is not None else ", NVIDIA's default mc_sim_7b_63"
    return f"an EAGLE-1/2 draft layer ({eagle.heads.name}): a tree of {len(eagle.tree)} nodes, {depth} deep{default} (num_eagle_layers {depth})"


def _medusa(tree: list[list[int]]) -> str:
    return f"Medusa heads: a tree of {len(tree)} nodes, {tree_depth(tree)} deep (reads heads 0..{tree_depth(tree) - 1})"
