"""The spec's build.speculative section: how drafts are made (a draft model, n-grams of the request, lookahead) and
how many tokens are drafted per step. Target-neutral: which target builds which mode is a rule in rules.py."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from pipeline.config.spec.choices import KVCacheQuant, ModelDType, QuantAlgo, SpeculativeMode
from pipeline.config.spec.speculative_heads import EagleSpec, MedusaSpec, MtpSpec
from pipeline.config.spec.strict import StrictModel

# The largest max_draft_len accepted. trtllm-build has no bound of its own for draft_tokens_external; its builder
# asserts max_draft_len <= 256 for EAGLE (builder.py), the largest draft TensorRT-LLM's speculative kernels are built
# for, and the engine's max_num_tokens must hold max_batch_size × (max_draft_len + 1) tokens. Useful drafts are
# 4-10 tokens long (examples/draft_target_model/README.md, examples/prompt_lookup/README.md).
MAX_DRAFT_LEN_CAP = 256

# What this pipeline cannot produce for each refused mode (it exports plain Llama-family checkpoints with ModelOpt).
_UNSUPPORTED_SPECULATIVE_MODES = {
    "explicit_draft_tokens": "(ReDrafter) needs a ReDrafter checkpoint with its trained recurrent drafter; this pipeline "
    "exports plain checkpoints with ModelOpt and cannot produce one",
}
_NEEDS_MAX_DRAFT_LEN = (SpeculativeMode.draft_tokens_external, SpeculativeMode.prompt_lookup)
# the section each mode reads (and only it may set)
_MODE_SECTIONS = (
    ("lookahead", SpeculativeMode.lookahead_decoding),
    ("prompt_lookup", SpeculativeMode.prompt_lookup),
    ("draft", SpeculativeMode.draft_tokens_external),
    ("medusa", SpeculativeMode.medusa),
    ("eagle", SpeculativeMode.eagle),
    ("mtp", SpeculativeMode.mtp),
)
_REQUIRED_SECTIONS = {
    SpeculativeMode.draft_tokens_external: "the draft model (source, and optionally dtype, quantize and build limits) whose tokens the model verifies",
    SpeculativeMode.medusa: "the Medusa heads directory (heads) and optionally the tree of candidates (choices)",
    SpeculativeMode.eagle: "the EAGLE draft checkpoint directory (heads): EAGLE-3 on target llmapi, EAGLE-1/2 on target engine",
}


def lookahead_max_draft_len(window_size: int, ngram_size: int, verification_set_size: int) -> int:
    """Draft tokens a lookahead (W, N, G) configuration needs: TensorRT-LLM's
    LookaheadDecodingConfig::calculateSpeculativeResourceTuple (maxDraftTokens), which examples/lookahead/README.md
    says the engine's --max_draft_len must equal."""
    first = 0 if ngram_size == 1 else ngram_size - 2
    return first + (window_size - 1 + verification_set_size) * (ngram_size - 1)


class LookaheadSpec(StrictModel):
    """Lookahead decoding's (W, N, G); the defaults are TensorRT-LLM's (LookaheadDecodingConfig)."""

    window_size: int = Field(default=4, ge=1, le=64, description="W: n-grams in the lookahead branch per step (Triton lookahead_window_size).")
    ngram_size: int = Field(default=3, ge=1, le=64, description="N: tokens per n-gram, the most draft tokens accepted per step (Triton lookahead_ngram_size).")
    verification_set_size: int = Field(default=4, ge=0, le=64, description="G: n-grams verified per step (Triton lookahead_verification_set_size).")

    @model_validator(mode="after")
    def _legal(self) -> LookaheadSpec:
        w, n, g = self.window_size, self.ngram_size, self.verification_set_size
        if n == 1 and (w != 1 or g != 0):
            raise ValueError(
                f"build.speculative.lookahead.ngram_size 1 needs window_size 1 and verification_set_size 0 "
                f"(TensorRT-LLM's legality rule), got window_size {w}, verification_set_size {g}"
            )
        if lookahead_max_draft_len(w, n, g) == 0:
            raise ValueError(
                "build.speculative.lookahead (1, 1, 0) decodes one token per step (no speculation); the smallest "
                "speculative configuration is window_size 2, ngram_size 2, verification_set_size 1"
            )
        return self


class PromptLookupSpec(StrictModel):
    """Prompt lookup (n-gram drafting): the draft is what followed the latest earlier occurrence of the sequence's tail."""

    max_matching_ngram_size: int = Field(
        default=3,
        ge=1,
        le=32,
        description="The longest tail of the sequence (prompt + output so far) looked up in it; shorter tails are tried "
        "when it does not occur (TensorRT-LLM's prompt_lookup_config max_matching_ngram_size).",
    )


class DraftQuantizeSpec(StrictModel):
    """The draft checkpoint's quantization: the formats of quantize.algo / quantize.kv_cache (the same format registry),
    calibrated on quantize.calibration with quantize.group_size and on quantize.device."""

    algo: QuantAlgo = Field(default=QuantAlgo.none, description="Weight/activation quantization of the draft (as quantize.algo).")
    kv_cache: KVCacheQuant = Field(default=KVCacheQuant.none, description="KV-cache quantization of the draft (as quantize.kv_cache).")


# The draft engine's own limits: engine and cpu targets (on llmapi the draft runs inside the model's LLM()).
_DRAFT_LIMIT = " Leave unset on the llmapi target, where the draft runs inside the model's LLM() with its limits."


class DraftModelSpec(StrictModel):
    """The draft model of draft_tokens_external: a smaller model with the same tokenizer, quantized and built like the
    target (its own engine, its own KV cache)."""

    source: Path = Field(
        description="Local Hugging Face checkpoint directory of the draft, under model.source's rules (relative to the "
        "YAML file, safetensors only, nothing downloaded). Its vocabulary must be the model's."
    )
    dtype: ModelDType | None = Field(default=None, description="Data type of the draft's non-quantized parts. Default: model.dtype.")
    quantize: DraftQuantizeSpec = Field(default_factory=DraftQuantizeSpec, description="Quantization of the draft. Default: none.")
    max_batch_size: int | None = Field(
        default=None, ge=1, le=65_536, description="The draft engine's max_batch_size. Default: build.max_batch_size." + _DRAFT_LIMIT
    )
    max_input_len: int | None = Field(default=None, ge=1, description="The draft engine's max_input_len. Default: build.max_input_len." + _DRAFT_LIMIT)
    max_seq_len: int | None = Field(
        default=None,
        ge=2,
        description="The draft engine's max_seq_len, at least the target's (build.max_seq_len or the model's) + "
        "max_draft_len, the longest sequence the draft extends. Default: that sum." + _DRAFT_LIMIT,
    )
    max_num_tokens: int | None = Field(default=None, ge=1, description="The draft engine's max_num_tokens. Default: build.max_num_tokens." + _DRAFT_LIMIT)


class SpeculativeSpec(StrictModel):
    """Speculative decoding: drafts of up to max_draft_len tokens, verified by the model in one step."""

    mode: SpeculativeMode = Field(
        description="draft_tokens_external (a draft model, build.speculative.draft), prompt_lookup (n-grams of the "
        "request's own tokens, no extra model; cpu and llmapi targets), lookahead_decoding (the engine drafts n-grams itself; "
        "engine target), medusa (trained Medusa heads propose a tree, build.speculative.medusa; cpu and engine "
        "targets), eagle (a trained EAGLE draft layer, build.speculative.eagle: EAGLE-3 on the llmapi target, EAGLE-1/2 "
        "with a tree of eagle_choices on the engine target) or mtp (the model's "
        "own multi-token-prediction layers, DeepSeek-V3 family; llmapi target). explicit_draft_tokens (ReDrafter) is "
        "refused: it needs a trained recurrent drafter this pipeline cannot convert."
    )
    max_draft_len: int | None = Field(
        default=None,
        ge=1,
        description=f"--max_draft_len: the most tokens drafted per step, 1..{MAX_DRAFT_LEN_CAP}; required for "
        "draft_tokens_external, prompt_lookup, and eagle on the llmapi target (requests draft num_draft_tokens <= it). "
        "Derived for the other modes: lookahead_decoding (N - 2 if N > 1 else 0) + (W - 1 + G) × (N - 1), which the "
        "engine and Triton's lookahead parameters must agree on (set it only to state that value); medusa, and eagle on "
        "the engine target, the tree's number of nodes (or a larger bound that requests' own choices may fill); mtp "
        "mtp.num_nextn_predict_layers, which it must equal.",
    )
    lookahead: LookaheadSpec = Field(default_factory=LookaheadSpec, description="Lookahead (W, N, G) for mode lookahead_decoding.")
    prompt_lookup: PromptLookupSpec = Field(default_factory=PromptLookupSpec, description="N-gram matching for mode prompt_lookup.")
    draft: DraftModelSpec | None = Field(default=None, description="The draft model; required for mode draft_tokens_external, only there.")
    medusa: MedusaSpec | None = Field(default=None, description="The Medusa heads and tree; required for mode medusa, only there.")
    eagle: EagleSpec | None = Field(default=None, description="The EAGLE draft checkpoint; required for mode eagle, only there.")
    mtp: MtpSpec | None = Field(default=None, description="The MTP layers used for mode mtp. Default: one (num_nextn_predict_layers 1).")
    draft_vocab_size: int | None = Field(
        default=None,
        ge=1,
        description="Mode draft_tokens_external on the cpu target: the draft proposes only the first N token ids, "
        "1..the draft's vocab_size (its lm_head keeps those rows, for a cheaper draft step; byte-level BPE numbers "
        "frequent merges first). It may cost acceptance, never correctness: the model verifies every draft. Unset: the "
        "whole vocabulary; the engine and llmapi targets refuse it (TensorRT-LLM 1.2's draft-target has no "
        "draft-vocabulary cut).",
    )

    @model_validator(mode="after")
    def _mode_fields(self) -> SpeculativeSpec:
        mode = self.mode.value
        if mode in _UNSUPPORTED_SPECULATIVE_MODES:
            raise ValueError(f"build.speculative.mode {mode} is refused: it {_UNSUPPORTED_SPECULATIVE_MODES[mode]}")
        for section, owner in _MODE_SECTIONS:
            if section in self.model_fields_set and getattr(self, section) is not None and self.mode is not owner:
                raise ValueError(f"build.speculative.{section} applies to mode {owner.value} only, not {mode}")
        if self.draft_vocab_size is not None and self.mode is not SpeculativeMode.draft_tokens_external:
            raise ValueError(f"build.speculative.draft_vocab_size applies to mode draft_tokens_external only (the draft model's vocabulary), not {mode}")
        required = dict((owner, name) for name, owner in _MODE_SECTIONS).get(self.mode)
        if self.mode in _REQUIRED_SECTIONS and getattr(self, required or "") is None:
            raise ValueError(f"build.speculative.{required} is required for mode {mode}: {_REQUIRED_SECTIONS[self.mode]}")
        if self.mode in _NEEDS_MAX_DRAFT_LEN and self.max_draft_len is None:
            raise ValueError(f"build.speculative.max_draft_len is required for mode {mode}: the most tokens drafted per step (e.g. 4)")
        if self.max_draft_len is not None and self.max_draft_len > MAX_DRAFT_LEN_CAP:
            raise ValueError(
                f"build.speculative.max_draft_len ({self.max_draft_len}) exceeds {MAX_DRAFT_LEN_CAP}, the largest draft "
                "TensorRT-LLM's speculative decoding supports (its builder's bound); useful drafts are 4-10 tokens"
            )
        if self.mode is SpeculativeMode.medusa:
            self._check_medusa_len()
        elif self.mode is SpeculativeMode.mtp:
            self._check_mtp_len()
        elif self.mode is SpeculativeMode.lookahead_decoding:
            self._check_lookahead_len()
        return self

    def _check_medusa_len(self) -> None:
        nodes = len(self.medusa.tree) if self.medusa is not None else 0
        if nodes > MAX_DRAFT_LEN_CAP:
            raise ValueError(
                f"build.speculative.medusa.choices has {nodes} nodes, more than {MAX_DRAFT_LEN_CAP} (the "
                "largest draft TensorRT-LLM's speculative decoding supports); the default tree of its Medusa "
                "example has 63"
            )
        if self.max_draft_len is not None and self.max_draft_len < nodes:
            raise ValueError(
                f"build.speculative.max_draft_len ({self.max_draft_len}) is below the {nodes} nodes of "
                "build.speculative.medusa.choices: a Medusa engine verifies every node of the tree in one step"
            )

    def _check_mtp_len(self) -> None:
        layers = (self.mtp or MtpSpec()).num_nextn_predict_layers
        if self.max_draft_len is not None and self.max_draft_len != layers:
            raise ValueError(
                f"build.speculative.max_draft_len ({self.max_draft_len}) must equal "
                f"build.speculative.mtp.num_nextn_predict_layers ({layers}): each MTP layer drafts one token "
                "(MTPDecodingConfig sets max_draft_len to it)"
            )

    def _check_lookahead_len(self) -> None:
        la = self.lookahead
        derived = lookahead_max_draft_len(la.window_size, la.ngram_size, la.verification_set_size)
        if self.max_draft_len is not None and self.max_draft_len != derived:
            raise ValueError(
                f"build.speculative.max_draft_len ({self.max_draft_len}) must equal the draft length of "
                f"build.speculative.lookahead (W {la.window_size}, N {la.ngram_size}, G {la.verification_set_size}) = {derived}: "
                "TensorRT-LLM requires the engine's --max_draft_len to equal the runtime's lookahead configuration"
            )

    @property
    def draft_len(self) -> int:
        """The --max_draft_len the engine is built with."""
        if self.mode in _NEEDS_MAX_DRAFT_LEN and self.max_draft_len is not None:
            return self.max_draft_len
        if self.mode is SpeculativeMode.medusa and self.medusa is not None:
            return self.max_draft_len or len(self.medusa.tree)
        if self.mode is SpeculativeMode.eagle and self.eagle is not None:  # the engine's tree (llmapi requires max_draft_len)
            return self.max_draft_len or len(self.eagle.tree)
        if self.mode is SpeculativeMode.mtp:
            return (self.mtp or MtpSpec()).num_nextn_predict_layers
        la = self.lookahead
        return lookahead_max_draft_len(la.window_size, la.ngram_size, la.verification_set_size)

    @property
    def engine_mode(self) -> str:
        """The trtllm-build --speculative_decoding_mode choice: prompt lookup is draft_tokens_external with drafts
        that come from the request instead of a draft engine (examples/prompt_lookup/README.md)."""
        return SpeculativeMode.draft_tokens_external.value if self.mode is SpeculativeMode.prompt_lookup else self.mode.value
