"""The served model's tokenizer, as the server needs it: exact prompt token counts and the chat template.

Counting uses the same library and call as the served preprocessing model (`tokenizers` on
`tokenizer.json`, `add_special_tokens` as its parameter says; transformers' AutoTokenizer for a
directory without tokenizer.json), so `usage.prompt_tokens` is the length of the `input_ids`
the engine receives. When the tokenizer has a chat template (`chat_template` in
tokenizer_config.json, or chat_template.jinja / chat_template.json), transformers' AutoTokenizer
is loaded once, up front, to render it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from clients.openai_server.model import ModelSetupError

CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


class PromptTokenizer:
    def __init__(self, directory: str | Path, *, add_special_tokens: bool = True) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise ModelSetupError(f"tokenizer directory {self.directory} does not exist")
        self.add_special_tokens = add_special_tokens
        config = _read_json(self.directory / "tokenizer_config.json")
        self.bos_token = _token_content(config.get("bos_token"))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever downloaded
        self._fast: Any = None
        self._auto: Any = None
        if (self.directory / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            self._fast = Tokenizer.from_file(str(self.directory / "tokenizer.json"))
        self.has_chat_template = bool(config.get("chat_template")) or any((self.directory / name).is_file() for name in CHAT_TEMPLATE_FILES)
        if self._fast is None or self.has_chat_template:
            self._auto = self._load_auto()
        self.adds_bos = self._adds_bos()

    def count(self, text: str) -> int:
        """Tokens of `text` as the preprocessing model encodes it."""
        return len(self.encode(text))

    def encode(self, text: str) -> list[int]:
        if self._fast is not None:
            return list(self._fast.encode(text, add_special_tokens=self.add_special_tokens).ids)
        return list(self._auto.encode(text, add_special_tokens=self.add_special_tokens))

    def apply_chat_template(self, messages: Sequence[dict[str, str]]) -> str:
        """The tokenizer's own chat template, rendered with the generation prompt."""
        if self._auto is None:
            raise ModelSetupError(f"the tokenizer in {self.directory} has no chat template")
        try:
            rendered = self._auto.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        except Exception as error:  # noqa: BLE001 - jinja errors of a model's template (e.g. raise_exception for a role order)
            raise ValueError(f"the model's chat template refused the messages: {error}") from None
        if not isinstance(rendered, str):
            raise ModelSetupError(f"the chat template of {self.directory} did not render text")
        return rendered

    def _load_auto(self) -> Any:
        try:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(str(self.directory), local_files_only=True)
        except Exception as error:  # noqa: BLE001 - transformers raises many kinds for an unusable directory
            raise ModelSetupError(f"cannot load the tokenizer in {self.directory}: {error}") from None

    def _adds_bos(self) -> bool:
        """Whether encoding (with this `add_special_tokens`) puts a BOS token first."""
        if not self.bos_token:
            return False
        with_bos = self.encode("a")
        if self._fast is not None:
            bos_id = self._fast.token_to_id(self.bos_token)
        else:
            bos_id = self._auto.convert_tokens_to_ids(self.bos_token)
        return bool(with_bos) and bos_id is not None and with_bos[0] == bos_id


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
        raise ModelSetupError(f"{path}: {error}") from None
    return loaded if isinstance(loaded, dict) else {}
