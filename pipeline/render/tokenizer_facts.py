"""What the model repository needs to know about the tokenizer the pre/postprocessing models load."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import StageError


@dataclass(frozen=True)
class TokenizerFacts:
    vocab_size: int  # ids the tokenizer can produce: base vocabulary plus added tokens
    eos_id: int | None
    pad_id: int | None
    # The most UTF-8 bytes one token stands for (special tokens as written): a text of B bytes
    # encodes to at least B / max_token_bytes tokens, so longer texts are refused untokenized.
    max_token_bytes: int | None = None


def tokenizer_facts(tokenizer_dir: Path) -> TokenizerFacts:
    tokenizer_json = tokenizer_dir / "tokenizer.json"
    if not tokenizer_json.is_file():
        raise StageError(
            f"{tokenizer_dir} has no tokenizer.json; the preprocessing and postprocessing models need a Hugging Face fast tokenizer",
            hint="the prepare stage copies tokenizer.json from model.source; point model.source at a checkpoint that has one",
        )
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_json))
    except Exception as error:  # tokenizers raises its own Exception subclass for malformed files
        raise StageError(f"{tokenizer_json}: cannot be loaded ({error})") from error
    config = _read_config(tokenizer_dir / "tokenizer_config.json")

    def special_id(key: str) -> int | None:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        return tokenizer.token_to_id(value) if isinstance(value, str) and value else None

    vocab = tokenizer.get_vocab(with_added_tokens=True)
    vocab_size = max(vocab.values(), default=-1) + 1
    eos_id = special_id("eos_token")
    pad_id = special_id("pad_token")
    return TokenizerFacts(
        vocab_size=vocab_size, eos_id=eos_id, pad_id=pad_id if pad_id is not None else eos_id, max_token_bytes=max_token_bytes(tokenizer, vocab_size)
    )


def max_token_bytes(tokenizer, vocab_size: int) -> int:
    """The longest text (UTF-8 bytes) any single token decodes to. A token holding part of a
    multi-byte character decodes to U+FFFD (3 bytes), which only overstates the bound."""
    texts = tokenizer.decode_batch([[token_id] for token_id in range(vocab_size)], skip_special_tokens=False)
    return max((len(text.encode("utf-8")) for text in texts), default=1) or 1


def _read_config(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise StageError(f"{path}: unreadable tokenizer config ({error})") from None
    return loaded if isinstance(loaded, dict) else {}
