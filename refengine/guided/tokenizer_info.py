"""TensorRT-LLM's `xgrammar_tokenizer_info.json`, read into an xgrammar `TokenizerInfo`.

The file is what NVIDIA's `examples/generate_xgrammar_tokenizer_info.py` writes for a Hugging Face
fast tokenizer (and what the Triton `tensorrt_llm` model's `xgrammar_tokenizer_info_path` names):
`encoded_vocab` (the tokens, by id), `tokenizer_str` (the tokenizer.json text, from which xgrammar
detects the vocabulary type: byte-level, byte-fallback or raw) and `stop_token_ids` (eos). The
package stage writes it on both targets; the cpu model reads it here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from refengine.errors import RefEngineError

if TYPE_CHECKING:
    from xgrammar import TokenizerInfo


class TokenizerInfoError(RefEngineError):
    """The tokenizer-info file is missing, unreadable or does not fit the model."""


def load_tokenizer_info(path: str | Path, vocab_size: int) -> TokenizerInfo:
    """An `xgrammar.TokenizerInfo` of `vocab_size` ids (the model's logits; ids past the tokenizer's
    vocabulary are never allowed)."""
    import xgrammar

    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
        encoded_vocab = document["encoded_vocab"]
        tokenizer_str = document["tokenizer_str"]
        stop_token_ids = [int(token_id) for token_id in document["stop_token_ids"] if token_id is not None]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise TokenizerInfoError(f"{path}: not a TensorRT-LLM xgrammar tokenizer-info file ({type(error).__name__}: {error})") from None
    if len(encoded_vocab) > vocab_size:
        raise TokenizerInfoError(f"{path}: {len(encoded_vocab)} tokens do not fit the model's vocabulary of {vocab_size}")
    if not stop_token_ids:
        raise TokenizerInfoError(f"{path}: no stop token (eos): a guided generation could never end on its own")
    metadata = xgrammar.TokenizerInfo._detect_metadata_from_hf(tokenizer_str)
    return xgrammar.TokenizerInfo(
        encoded_vocab,
        metadata["vocab_type"],
        vocab_size=vocab_size,
        stop_token_ids=stop_token_ids,
        add_prefix_space=metadata["add_prefix_space"],
    )
