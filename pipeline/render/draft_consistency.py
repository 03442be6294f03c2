"""Engine ↔ Triton checks of draft-target speculative decoding (two tensorrt_llm models and the BLS,
tensorrt_llm_draft_model_name), from the target's and the draft's config.json: TensorRT-LLM 1.2's rules (examples/draft_target_model/README.md)
that the engines must keep after the build. Each message names both sides."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.backends.engine_facts import EngineFacts, engine_facts
from pipeline.config.spec import ServeSpec


def draft_problems(facts: EngineFacts, serve: ServeSpec, draft_config: Mapping[str, Any] | None) -> list[str]:
    """The draft engine against the target engine and the serve spec; a draft_tokens_external engine needs one."""
    if facts.speculative_decoding_mode != "draft_tokens_external":
        return (
            ["the repository has a draft engine but the engine has no build_config.speculative_decoding_mode draft_tokens_external"]
            if draft_config is not None
            else []
        )
    if draft_config is None:
        return []  # prompt lookup: drafts from the request (cpu engine); the spec refuses it where a draft model is needed
    draft = engine_facts(draft_config, "the draft engine's config.json")
    problems = []
    if draft.vocab_size != facts.vocab_size:
        problems.append(
            f"the draft engine's pretrained_config.vocab_size is {draft.vocab_size} but the engine's is "
            f"{facts.vocab_size}: draft tokens are token ids of one tokenizer"
        )
    if draft.max_seq_len < facts.max_seq_len:
        problems.append(
            f"the draft engine's build_config.max_seq_len ({draft.max_seq_len}) is below the engine's "
            f"({facts.max_seq_len}, max_draft_len included): the draft extends every sequence the engine accepts"
        )
    if draft.speculative_decoding_mode is not None:
        problems.append(
            f"the draft engine has build_config.speculative_decoding_mode {draft.speculative_decoding_mode}: a draft engine decodes one token per step"
        )
    if draft.max_beam_width > 1:
        problems.append(f"the draft engine has build_config.max_beam_width {draft.max_beam_width}: draft-target decoding runs one beam")
    if not serve.enable_kv_cache_reuse:
        problems.append(
            "serve.enable_kv_cache_reuse is false but the engine is draft_tokens_external: both models re-read "
            "the whole sequence at every draft step, which TensorRT-LLM's draft-target recipe serves from reused KV blocks"
        )
    for name, which in ((facts, "engine"), (draft, "draft engine")):
        if not name.use_paged_context_fmha:
            problems.append(
                f"the {which} has plugin_config.use_paged_context_fmha false: draft-target decoding needs paged context FMHA (KV-cache reuse) on both models"
            )
    return problems
