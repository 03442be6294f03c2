"""Checks of build.speculative.draft against the draft's config.json and the model's, at validate: a checkpoint
directory, the same vocabulary and tokenizer as the model (draft tokens are token ids the model verifies), and room
for the model's longest sequence plus a draft."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from pipeline.config.model_info import ModelConfigError, ModelInfo, read_model_info
from pipeline.config.spec import Spec
from pipeline.config.spec.draft import draft_spec

Issue = tuple[tuple[str | int, ...], str]
WHERE = ("build", "speculative", "draft", "source")


def draft_issues(spec: Spec, info: ModelInfo, check_model: Callable[[Spec, ModelInfo], list[Issue]]) -> list[Issue]:
    draft = draft_spec(spec)  # the Spec validated it: this does not raise
    if draft is None:
        return []
    source = draft.model.source
    if not source.is_dir() or not (source / "config.json").is_file():
        return [(WHERE, f"{source} is not a Hugging Face checkpoint directory (no config.json)")]
    try:
        draft_info = read_model_info(source)
    except (ModelConfigError, OSError, ValueError) as exc:
        return [(WHERE, f"{source}: {exc}")]
    issues: list[Issue] = [(WHERE, f"the draft: {message}") for _, message in check_model(draft, draft_info)]
    if draft_info.vocab_size != info.vocab_size:
        issues.append(
            (
                WHERE,
                (
                    f"the draft's vocab_size ({draft_info.vocab_size}, {source / 'config.json'}) differs from the model's "
                    f"({info.vocab_size}): draft tokens are token ids the model verifies, so both need one tokenizer"
                ),
            )
        )
    elif _tokenizer_digest(source) not in (None, _tokenizer_digest(info.path)) and _tokenizer_digest(info.path) is not None:
        issues.append(
            (
                WHERE,
                (
                    f"the draft's tokenizer ({source / 'tokenizer.json'}) has another vocabulary or merges than the model's "
                    f"({info.path / 'tokenizer.json'}): draft tokens are token ids the model verifies, so both need one tokenizer"
                ),
            )
        )
    build, speculative = spec.build, spec.build.speculative
    if speculative is not None and speculative.draft_vocab_size is not None and speculative.draft_vocab_size > draft_info.vocab_size:
        issues.append(
            (
                ("build", "speculative", "draft_vocab_size"),
                (
                    f"build.speculative.draft_vocab_size ({speculative.draft_vocab_size}) exceeds the draft's vocab_size "
                    f"({draft_info.vocab_size}, {source / 'config.json'}): it keeps the first N of the draft's token ids"
                ),
            )
        )
    if speculative is not None and speculative.draft is not None and speculative.draft.max_seq_len is not None:
        model_len = build.max_seq_len or info.default_max_seq_len()
        if speculative.draft.max_seq_len < model_len + speculative.draft_len:
            issues.append(
                (
                    ("build", "speculative", "draft", "max_seq_len"),
                    (
                        f"build.speculative.draft.max_seq_len ({speculative.draft.max_seq_len}) must hold the model's max_seq_len "
                        f"({model_len}) + build.speculative.max_draft_len ({speculative.draft_len})"
                    ),
                )
            )
    return issues


def _tokenizer_digest(directory: Path) -> str | None:
    """The tokenizer's vocabulary and merges (tokenizer.json's `model`) and added tokens, by digest; None without one.
    Chat templates and post-processors may differ between models of one family (Llama 3.1 and 3.2) and do not matter."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the model's own tokenizer checks report an unreadable file
    if not isinstance(loaded, dict):
        return None
    key = {"model": loaded.get("model"), "added_tokens": [(t.get("id"), t.get("content")) for t in loaded.get("added_tokens") or [] if isinstance(t, dict)]}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
