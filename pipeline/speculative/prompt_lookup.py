"""Prompt lookup (build.speculative.mode prompt_lookup): the draft is what followed the latest earlier occurrence of
the sequence's tail; to trtllm-build it is draft_tokens_external with drafts from the request
(TensorRT-LLM 1.2 examples/prompt_lookup/README.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.config.spec import SpeculativeMode
from pipeline.speculative.base import ModeDefaults
from pipeline.speculative.draft_target import draft_len_problems

if TYPE_CHECKING:
    from pipeline.backends.engine_facts import EngineFacts
    from pipeline.config.spec import BuildSpec, SpeculativeSpec


class PromptLookup(ModeDefaults):
    mode = SpeculativeMode.prompt_lookup

    def drafts(self, build: BuildSpec) -> str:
        ngram = build.speculative.prompt_lookup.max_matching_ngram_size if build.speculative is not None else 0
        return f"n-grams of the request (up to {ngram} tokens matched)"

    def consistency_problems(self, facts: EngineFacts, speculative: SpeculativeSpec) -> list[str]:
        return draft_len_problems(facts, speculative)

    def llmapi_config(self, speculative: SpeculativeSpec) -> dict[str, Any] | str | None:
        return {
            "decoding_type": "NGram",  # NGramDecodingConfig
            "max_draft_len": speculative.max_draft_len,
            "max_matching_ngram_size": speculative.prompt_lookup.max_matching_ngram_size,
        }


RULES = PromptLookup()
