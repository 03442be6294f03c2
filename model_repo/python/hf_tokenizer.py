"""A Hugging Face tokenizer directory, loaded offline, with the ids the LLM contract needs.

`tokenizer.json` is loaded with the `tokenizers` library directly (fast, no torch import); a
directory without it (e.g. SentencePiece `tokenizer.model` only) goes through transformers'
`AutoTokenizer` with `local_files_only=True`. Special tokens come from `tokenizer_config.json`
(`eos_token`, `pad_token`, `bos_token`), as transformers reads them.

The batch calls run serially (TOKENIZERS_PARALLELISM false unless set): a Python model instance has one
core's worth of work to give, and for the few short sequences of one execution the tokenizers library's
thread pool costs more CPU than it saves (measured: a batch of 2 decodes 9.9 µs parallel, 2.3 µs serial).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenizers import Tokenizer

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class TokenizerLoadError(RuntimeError):
    """The tokenizer directory cannot be used."""


class HFTokenizer:
    _fast: Tokenizer | None  # tokenizer.json, by the tokenizers library
    _slow: Any  # else transformers' AutoTokenizer (None with _fast)

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise TokenizerLoadError(f"tokenizer directory {self.directory} does not exist")
        self._config = _read_json(self.directory / "tokenizer_config.json")
        tokenizer_json = self.directory / "tokenizer.json"
        if tokenizer_json.is_file():
            from tokenizers import Tokenizer

            self._fast = Tokenizer.from_file(str(tokenizer_json))
            self._slow = None
        else:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from transformers import AutoTokenizer

            self._fast = None
            self._slow = AutoTokenizer.from_pretrained(str(self.directory), local_files_only=True)
        self.bos_token = _token_content(self._config.get("bos_token"))
        self.eos_id = self._special_id("eos_token")
        self.bos_id = self._special_id("bos_token")
        pad_id = self._special_id("pad_token")
        self.pad_id = pad_id if pad_id is not None else self.eos_id

    @property
    def config(self) -> dict[str, Any]:
        """tokenizer_config.json ({} when there is none)."""
        return self._config

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer knows, added tokens included."""
        if self._fast is not None:
            return self._fast.get_vocab_size(with_added_tokens=True)
        return len(self._slow)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if self._fast is not None:
            return list(self._fast.encode(text, add_special_tokens=add_special_tokens).ids)
        return list(self._slow.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        ids = [int(token_id) for token_id in token_ids]
        if self._fast is not None:
            return self._fast.decode(ids, skip_special_tokens=skip_special_tokens)
        text: str = self._slow.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)
        return text

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[int]]:
        """`encode` of every text, in one call of the tokenizer."""
        if self._fast is not None:
            return [list(encoding.ids) for encoding in self._fast.encode_batch(list(texts), add_special_tokens=add_special_tokens)]
        return [list(ids) for ids in self._slow(list(texts), add_special_tokens=add_special_tokens)["input_ids"]]

    def decode_batch(self, sequences: Sequence[Sequence[int]], *, skip_special_tokens: bool = True) -> list[str]:
        """`decode` of every token sequence, in one call of the tokenizer."""
        lists = [[int(token_id) for token_id in ids] for ids in sequences]
        if self._fast is not None:
            return self._fast.decode_batch(lists, skip_special_tokens=skip_special_tokens)
        texts: list[str] = self._slow.batch_decode(lists, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)
        return texts

    def _special_id(self, key: str) -> int | None:
        token = _token_content(self._config.get(key))
        if token is None:
            return None
        if self._fast is not None:
            return self._fast.token_to_id(token)
        token_id: int | None = self._slow.convert_tokens_to_ids(token)
        return token_id


def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise TokenizerLoadError(f"{path}: {error}") from error
    return loaded if isinstance(loaded, dict) else {}
