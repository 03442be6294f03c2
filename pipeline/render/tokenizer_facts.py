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
    return TokenizerFacts(vocab_size=vocab_size, eos_id=eos_id, pad_id=pad_id if pad_id is not None else eos_id)


def _read_config(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise StageError(f"{path}: unreadable tokenizer config ({error})") from None
    return loaded if isinstance(loaded, dict) else {}
