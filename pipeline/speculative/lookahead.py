"""Lookahead decoding (build.speculative.mode lookahead_decoding): the engine drafts n-grams itself, with (W, N, G)
that the engine's max_draft_len and Triton's lookahead parameters must agree on (TensorRT-LLM 1.2
examples/lookahead/README.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.config.spec import SpeculativeMode
from pipeline.speculative.base import ModeDefaults

if TYPE_CHECKING:
    from pipeline.backends.engine_facts import EngineFacts
    from pipeline.config.spec import BuildSpec, SpeculativeSpec


class Lookahead(ModeDefaults):
    mode = SpeculativeMode.lookahead_decoding

    def drafts(self, build: BuildSpec) -> str:
        la = build.speculative.lookahead if build.speculative is not None else None
        if la is None:
            return ""
        return f"the engine's lookahead n-grams (W {la.window_size}, N {la.ngram_size}, G {la.verification_set_size})"

    def triton_parameters(self, facts: EngineFacts, speculative: SpeculativeSpec) -> dict[str, str]:
        if facts.speculative_decoding_mode != "lookahead_decoding":
            return {}
        lookahead = speculative.lookahead
        return {
            "lookahead_window_size": str(lookahead.window_size),
            "lookahead_ngram_size": str(lookahead.ngram_size),
            "lookahead_verification_set_size": str(lookahead.verification_set_size),
        }

    def consistency_problems(self, facts: EngineFacts, speculative: SpeculativeSpec) -> list[str]:
        problems = []
        la = speculative.lookahead
        if speculative.draft_len != facts.max_draft_len:
            problems.append(
                f"build.speculative.lookahead (W {la.window_size}, N {la.ngram_size}, G {la.verification_set_size}) needs "
                f"max_draft_len {speculative.draft_len}, but the engine has build_config.max_draft_len {facts.max_draft_len}: "
                "the runtime's lookahead configuration must equal the engine's"
            )
        if facts.max_beam_width > 1:
            problems.append(
                f"the engine has build_config.speculative_decoding_mode lookahead_decoding and build_config.max_beam_width "
                f"{facts.max_beam_width}: decoding_mode lookahead excludes beam_search"
            )
        return problems

    def llmapi_config(self, speculative: SpeculativeSpec) -> dict[str, Any] | str | None:
        return (
            "lookahead decoding does not run on TensorRT-LLM's PyTorch backend (LookaheadDecodingConfig."
            "supports_backend excludes 'pytorch'; NVIDIA lists Draft/Target, EAGLE 3, NGram, MTP and user-provided "
            "drafting for it): its draft-free counterpart is prompt lookup (NGramDecodingConfig)"
        )


RULES = Lookahead()
