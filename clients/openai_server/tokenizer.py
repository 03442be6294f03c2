"""The served model's tokenizer, as the server needs it: exact prompt token counts and the chat template.

Counting uses the served preprocessing model's own tokenizer class (model_repo's HFTokenizer:
`tokenizers` on `tokenizer.json`, `add_special_tokens` as its parameter says; transformers'
AutoTokenizer for a directory without tokenizer.json), so `usage.prompt_tokens` is the length of
the `input_ids` the engine receives, and requests that go to the `tensorrt_llm` model directly
(token-id prompts, log-probs from logits) are encoded and decoded exactly as the ensemble would.
When the tokenizer has a chat template (`chat_template` in tokenizer_config.json, or
chat_template.jinja / chat_template.json), transformers' AutoTokenizer is loaded once, up front,
to render it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clients.openai_server.model import ModelSetupError
from model_repo.python.hf_tokenizer import HFTokenizer, TokenizerLoadError
from model_repo.python.incremental_detokenizer import text_delta

CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


class PromptTokenizer:
    """The served preprocessing / postprocessing models' own tokenizer class (HFTokenizer), with the
    preprocessing's `add_special_tokens` and the postprocessing's `skip_special_tokens`."""

    def __init__(self, directory: str | Path, *, add_special_tokens: bool = True, skip_special_tokens: bool = True) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise ModelSetupError(f"tokenizer directory {self.directory} does not exist")
        self.add_special_tokens = add_special_tokens
        self.skip_special_tokens = skip_special_tokens
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever downloaded
        try:
            self._tokenizer = HFTokenizer(self.directory)
        except TokenizerLoadError as error:
            raise ModelSetupError(str(error)) from None
        except Exception as error:  # noqa: BLE001 - tokenizers / transformers raise many kinds for an unusable directory
            raise ModelSetupError(f"cannot load the tokenizer in {self.directory}: {error}") from None
        self.bos_token = self._tokenizer.bos_token
        self.has_chat_template = bool(self._tokenizer.config.get("chat_template")) or any((self.directory / name).is_file() for name in CHAT_TEMPLATE_FILES)
        self._auto: Any = self._load_auto() if self.has_chat_template else None
        self.adds_bos = self._adds_bos()

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.vocab_size

    @property
    def end_id(self) -> int | None:
        return self._tokenizer.eos_id

    @property
    def pad_id(self) -> int | None:
        return self._tokenizer.pad_id

    def count(self, text: str) -> int:
        """Tokens of `text` as the preprocessing model encodes it."""
        return len(self.encode(text))

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=self.add_special_tokens)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text as the postprocessing model decodes it."""
        return self._tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token on its own, special tokens shown (the `tokens` of OpenAI log-probs)."""
        return self._tokenizer.decode([token_id], skip_special_tokens=False)

    def text_delta(self, preceding_ids: Sequence[int], new_ids: Sequence[int]) -> str:
        """The text `new_ids` add after `preceding_ids`, as postprocessing streams it."""
        return text_delta(self.decode, preceding_ids, new_ids)

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
        bos_id = self._tokenizer.bos_id
        with_bos = self.encode("a")
        return bos_id is not None and bool(with_bos) and with_bos[0] == bos_id
