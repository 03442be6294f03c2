"""build.speculative against the rest of the spec: the target's modes, and TensorRT-LLM 1.2's rules for draft-target
(examples/draft_target_model/README.md: paged context FMHA and KV-cache block reuse on both models, beam width 1) that
are spec facts. Rules that need the model's config.json (the draft's vocabulary, the deduced max_seq_len) are in
pipeline.config.model_checks; the draft's own sections are checked as a spec of their own (pipeline.config.spec.draft)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.config.spec.choices import SpeculativeMode
from pipeline.config.spec.speculative import MAX_DRAFT_LEN_CAP
from pipeline.config.targets import Target, traits_of

if TYPE_CHECKING:
    from pipeline.config.spec.build import BuildSpec
    from pipeline.config.spec.serve import ServeSpec
    from pipeline.config.spec.speculative import SpeculativeSpec


def check_speculative(build: BuildSpec, serve: ServeSpec) -> None:
    speculative = build.speculative
    if speculative is None:
        return
    mode = speculative.mode.value
    refused = traits_of(build.target).refused_speculative_modes
    if mode in refused:
        builders = " or ".join(t.value for t in Target if traits_of(t).builds_speculative and mode not in traits_of(t).refused_speculative_modes)
        raise ValueError(
            f"build.speculative.mode {mode} is refused on build.target {build.target.value}: {refused[mode]}"
            + (f" (target {builders} builds it)" if builders else "")
        )
    why_not = traits_of(build.target).no_draft_vocab_size_because
    if speculative.draft_vocab_size is not None and why_not is not None:
        builders = " or ".join(t.value for t in Target if traits_of(t).no_draft_vocab_size_because is None)
        raise ValueError(f"build.speculative.draft_vocab_size is refused on build.target {build.target.value}: {why_not}; target {builders} builds it")
    if speculative.mode is SpeculativeMode.eagle:
        _check_eagle(build, speculative)
    why_not = traits_of(build.target).no_medusa_vocab_size_because
    if speculative.medusa is not None and speculative.medusa.vocab_size is not None and why_not is not None:
        builders = " or ".join(t.value for t in Target if traits_of(t).no_medusa_vocab_size_because is None)
        raise ValueError(f"build.speculative.medusa.vocab_size is refused on build.target {build.target.value}: {why_not}; target {builders} builds it")
    if speculative.mode is not SpeculativeMode.draft_tokens_external:
        return  # LoRA with lookahead: a warning of the engine build (trtllm_rules)
    if build.lora is not None:
        raise ValueError(
            "build.lora cannot be combined with build.speculative.mode draft_tokens_external: the draft model would "
            "propose tokens without the adapters the target applies (TensorRT-LLM documents no LoRA with draft-target)"
        )
    if not serve.enable_kv_cache_reuse:
        raise ValueError(
            "serve.enable_kv_cache_reuse must be true with build.speculative.mode draft_tokens_external: each draft "
            "step sends the whole sequence to both models again, and TensorRT-LLM's draft-target recipe requires KV-cache "
            "block reuse (--kv_cache_enable_block_reuse, examples/draft_target_model/README.md)"
        )
    draft = speculative.draft
    if draft is not None and draft.max_seq_len is not None and build.max_seq_len is not None:
        needed = build.max_seq_len + speculative.draft_len
        if draft.max_seq_len < needed:
            raise ValueError(
                f"build.speculative.draft.max_seq_len ({draft.max_seq_len}) must hold build.max_seq_len "
                f"({build.max_seq_len}) + build.speculative.max_draft_len ({speculative.draft_len}) = {needed}: the draft "
                "extends every sequence the model accepts by a whole draft"
            )


def _check_eagle(build: BuildSpec, speculative: SpeculativeSpec) -> None:
    """One eagle section, two generations: EAGLE-3 (a chain of max_draft_len tokens) or EAGLE-1/2 (a tree)."""
    target = build.target.value
    eagle, generation = speculative.eagle, traits_of(build.target).eagle_generation
    if eagle is None:
        return
    if generation == "EAGLE-3":
        if eagle.choices is not None:
            raise ValueError(
                f"build.speculative.eagle.choices is refused on build.target {target}: its EAGLE-3 drafts a "
                "chain of max_draft_len tokens (Eagle3DecodingConfig); eagle_choices trees are EAGLE-1/2's, "
                "on target engine"
            )
        if speculative.max_draft_len is None:
            raise ValueError(
                f"build.speculative.max_draft_len is required for mode eagle on build.target {target}: the tokens the EAGLE-3 layer drafts per step (e.g. 3)"
            )
        return
    if "one_model" in eagle.model_fields_set:
        raise ValueError(
            f"build.speculative.eagle.one_model applies to EAGLE-3 (target llmapi), not to build.target "
            f"{target}'s {generation}, whose draft layers are built into the engine"
        )
    nodes = len(eagle.tree)
    if nodes > MAX_DRAFT_LEN_CAP:
        raise ValueError(
            f"build.speculative.eagle.choices has {nodes} nodes, more than {MAX_DRAFT_LEN_CAP} (TensorRT-LLM's "
            "EAGLE builder asserts max_draft_len <= 256); NVIDIA's default tree mc_sim_7b_63 has 63"
        )
    if speculative.max_draft_len is not None and speculative.max_draft_len < nodes:
        raise ValueError(
            f"build.speculative.max_draft_len ({speculative.max_draft_len}) is below the {nodes} nodes of "
            "build.speculative.eagle.choices"
            + ("" if eagle.choices is not None else " (NVIDIA's default tree mc_sim_7b_63)")
            + ": an EAGLE engine verifies every node of the tree in one step"
        )
