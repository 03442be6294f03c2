"""Building the drafter an engine directory asks for (`refengine_speculative`, settings.py)."""

from __future__ import annotations

from refengine.checkpoint import EngineDirectory, load_engine_dir
from refengine.config import EngineConfig
from refengine.errors import EngineConfigError
from refengine.model_runner import load_model, torch_dtype
from refengine.speculative.draft_model import DraftModelDrafter
from refengine.speculative.medusa_heads import MedusaHeads
from refengine.speculative.medusa_planner import MedusaDrafter
from refengine.speculative.ngram import NGramDrafter
from refengine.speculative.planner import Drafter
from refengine.speculative.settings import SPECULATIVE_KEY, SpeculativeSettings, check_draft_fits, read_speculative_settings


def speculative_settings(engine: EngineDirectory) -> SpeculativeSettings | None:
    return read_speculative_settings(engine.directory, engine.raw_config, engine.build_config)


def load_drafter(engine: EngineDirectory, settings: SpeculativeSettings, config: EngineConfig) -> Drafter | MedusaDrafter:
    """The n-gram drafter, the Medusa heads with the engine's tree, or the draft model loaded with a KV cache for max_batch_size sequences
    of max_seq_len tokens (drafts stay within a request's prompt + max_tokens): the lean path's
    contiguous slots for a dense Llama draft, else paged blocks."""
    if settings.kind == "ngram":
        return NGramDrafter(settings.max_matching_ngram_size)
    if settings.medusa is not None:
        medusa, model_config = settings.medusa, engine.checkpoint.config
        if medusa.vocab_size is not None and medusa.vocab_size > model_config.vocab_size:
            raise EngineConfigError(
                f"{SPECULATIVE_KEY}.medusa_vocab_size",
                f"{medusa.vocab_size} exceeds the model's vocab_size {model_config.vocab_size} (the heads keep the first M token ids)",
            )
        heads = MedusaHeads.load(
            medusa.heads_file,
            medusa.num_heads,
            medusa.num_layers,
            model_config.hidden_size,
            model_config.vocab_size,
            torch_dtype(config.compute_dtype),
            f"{SPECULATIVE_KEY}.medusa_heads",
            fp16_gemm=config.fp16_weight_gemm,
            medusa_vocab_size=medusa.vocab_size,
        )
        return MedusaDrafter(heads, medusa.choices, settings.max_draft_len)
    if settings.draft_engine_dir is None:  # read_speculative_settings guarantees it for draft_model
        raise ValueError("draft_model settings without a draft_engine_dir")
    draft = load_engine_dir(settings.draft_engine_dir)
    check_draft_fits(
        engine.directory,
        engine.checkpoint.config.vocab_size,
        config.max_seq_len,
        draft.directory,
        draft.checkpoint.config.vocab_size,
        draft.build_config,
    )
    if settings.draft_vocab_size is not None and settings.draft_vocab_size > draft.checkpoint.config.vocab_size:
        raise EngineConfigError(
            f"{SPECULATIVE_KEY}.draft_vocab_size",
            f"{settings.draft_vocab_size} exceeds the draft's vocab_size {draft.checkpoint.config.vocab_size} (it keeps the first N token ids)",
        )
    model = load_model(draft.checkpoint, torch_dtype(config.compute_dtype))
    blocks_per_sequence = -(-config.max_seq_len // config.tokens_per_block)
    return DraftModelDrafter(
        model,
        config.max_batch_size * blocks_per_sequence,
        config.tokens_per_block,
        vocab_size=settings.draft_vocab_size,
        lean_slots=(config.max_batch_size, config.max_seq_len),
    )
