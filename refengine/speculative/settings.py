"""The speculative-decoding settings of a CPU engine directory, checked when the engine loads.

`config.json` carries TensorRT-LLM's `build_config.max_draft_len` (K) and
`build_config.speculative_decoding_mode` (TensorRT-LLM's `SpeculativeDecodingMode` IntFlag:
1 NONE, 2 DRAFT_TOKENS_EXTERNAL, 4 MEDUSA, ... 64 NGRAM), and at the top level the reference engine's

    "refengine_speculative": {"kind": "draft_model" | "ngram" | "medusa", "max_draft_len": K,
                              "draft_engine_dir": "draft", "max_matching_ngram_size": N}

Kind medusa (mode 4) adds `medusa_heads` (the heads file, relative to the engine directory: medusa_heads.py),
`num_medusa_heads`, `num_medusa_layers` and `medusa_choices` (the engine's tree: medusa_tree.py; its node count is at
most max_draft_len, its depth at most num_medusa_heads); optional `medusa_vocab_size` M: the heads propose only the
first M token ids (cheaper heads: medusa_heads.py).

`draft_engine_dir` (draft_model only) is relative to the engine directory and is a CPU engine
directory itself; optional `draft_vocab_size` (draft_model only) N drafts only the first N token ids
(a cheaper draft lm_head: draft_model.py); `max_matching_ngram_size` (ngram only, default 3) is the longest suffix n-gram
looked up in the prompt + output. Every inconsistency is an `EngineConfigError` naming the field.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from refengine.errors import EngineConfigError
from refengine.speculative.medusa_tree import check_medusa_choices

SPECULATIVE_KEY = "refengine_speculative"
MODE_NONE = 1  # TensorRT-LLM SpeculativeDecodingMode.NONE
MODE_DRAFT_TOKENS_EXTERNAL = 2  # SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL
MODE_MEDUSA = 4  # SpeculativeDecodingMode.MEDUSA
MODE_NGRAM = 64  # SpeculativeDecodingMode.NGRAM (1.x); an n-gram engine may also say 2
KINDS = ("draft_model", "ngram", "medusa")
DEFAULT_MAX_MATCHING_NGRAM_SIZE = 3
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


@dataclass(frozen=True)
class SpeculativeSettings:
    kind: str
    max_draft_len: int
    draft_engine_dir: Path | None = None  # absolute (draft_model)
    max_matching_ngram_size: int = DEFAULT_MAX_MATCHING_NGRAM_SIZE
    draft_vocab_size: int | None = None  # draft_model: draft only the first N token ids (None: all)
    medusa: MedusaSettings | None = None  # medusa


@dataclass(frozen=True)
class MedusaSettings:
    heads_file: Path  # absolute
    num_heads: int
    num_layers: int
    choices: tuple[tuple[int, ...], ...]  # checked, in (depth, path) order
    vocab_size: int | None = None  # medusa_vocab_size: propose only the first M token ids (None: all)


def read_speculative_settings(engine_dir: Path, raw_config: Mapping[str, Any], build_config: Mapping[str, Any]) -> SpeculativeSettings | None:
    """The engine's settings, or None for an engine built without speculation."""
    section = raw_config.get(SPECULATIVE_KEY)
    mode = build_config.get("speculative_decoding_mode", MODE_NONE)
    built_len = build_config.get("max_draft_len", 0) or 0
    if section is None:
        if mode not in (None, MODE_NONE) or built_len:
            raise EngineConfigError(
                SPECULATIVE_KEY,
                f"build_config has speculative_decoding_mode {mode} / max_draft_len {built_len} but config.json has no "
                f"{SPECULATIVE_KEY!r} section saying how the reference engine drafts (kind draft_model or ngram)",
            )
        return None
    if not isinstance(section, Mapping):
        raise EngineConfigError(SPECULATIVE_KEY, f"must be an object, got {section!r:.80}")
    kind = section.get("kind")
    if kind not in KINDS:
        raise EngineConfigError(f"{SPECULATIVE_KEY}.kind", f"{kind!r} is not one of {', '.join(KINDS)}")
    k = section.get("max_draft_len")
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise EngineConfigError(f"{SPECULATIVE_KEY}.max_draft_len", f"must be a positive integer, got {k!r}")
    if k != built_len:
        raise EngineConfigError(f"{SPECULATIVE_KEY}.max_draft_len", f"{k} differs from build_config.max_draft_len {built_len}")
    allowed_modes = {"ngram": (MODE_DRAFT_TOKENS_EXTERNAL, MODE_NGRAM), "medusa": (MODE_MEDUSA,)}.get(kind, (MODE_DRAFT_TOKENS_EXTERNAL,))
    if mode not in allowed_modes:
        raise EngineConfigError(
            "build_config.speculative_decoding_mode",
            f"{mode!r} does not fit kind {kind} (expected {' or '.join(map(str, allowed_modes))}: TensorRT-LLM's SpeculativeDecodingMode)",
        )
    if kind == "ngram":
        size = section.get("max_matching_ngram_size", DEFAULT_MAX_MATCHING_NGRAM_SIZE)
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise EngineConfigError(f"{SPECULATIVE_KEY}.max_matching_ngram_size", f"must be a positive integer, got {size!r}")
        return SpeculativeSettings(kind, k, None, size)
    if kind == "medusa":
        return SpeculativeSettings(kind, k, medusa=_medusa_settings(engine_dir, section, k))
    draft = section.get("draft_engine_dir")
    if not isinstance(draft, str) or not draft:
        raise EngineConfigError(f"{SPECULATIVE_KEY}.draft_engine_dir", f"kind draft_model needs a directory name, got {draft!r}")
    draft_dir = (engine_dir / draft).resolve()
    if not (draft_dir / "config.json").is_file():
        raise EngineConfigError(f"{SPECULATIVE_KEY}.draft_engine_dir", f"{draft_dir} is not a CPU engine directory (no config.json)")
    vocab = section.get("draft_vocab_size")
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, int) or vocab <= 0):
        raise EngineConfigError(f"{SPECULATIVE_KEY}.draft_vocab_size", f"must be a positive integer (the first N token ids), got {vocab!r}")
    return SpeculativeSettings(kind, k, draft_dir, draft_vocab_size=vocab)


def _medusa_settings(engine_dir: Path, section: Mapping[str, Any], max_draft_len: int) -> MedusaSettings:
    heads = section.get("medusa_heads")
    if not isinstance(heads, str) or not heads:
        raise EngineConfigError(f"{SPECULATIVE_KEY}.medusa_heads", f"kind medusa needs the heads file's path, got {heads!r}")
    heads_file = (engine_dir / heads).resolve()
    if not heads_file.is_file():
        raise EngineConfigError(f"{SPECULATIVE_KEY}.medusa_heads", f"{heads_file} does not exist")
    sizes = []
    for name in ("num_medusa_heads", "num_medusa_layers"):
        value = section.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise EngineConfigError(f"{SPECULATIVE_KEY}.{name}", f"must be a positive integer, got {value!r}")
        sizes.append(value)
    field = f"{SPECULATIVE_KEY}.medusa_choices"
    try:
        choices = check_medusa_choices(section.get("medusa_choices"), sizes[0], max_draft_len, field)
    except ValueError as error:
        raise EngineConfigError(field, str(error).removeprefix(f"{field}: ")) from None
    vocab = section.get("medusa_vocab_size")
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, int) or vocab <= 0):
        raise EngineConfigError(f"{SPECULATIVE_KEY}.medusa_vocab_size", f"must be a positive integer (the first M token ids), got {vocab!r}")
    return MedusaSettings(heads_file, sizes[0], sizes[1], choices, vocab)


def check_draft_fits(
    target_dir: Path,
    target_vocab_size: int,
    target_max_seq_len: int,
    draft_dir: Path,
    draft_vocab_size: int,
    draft_build_config: Mapping[str, Any],
) -> None:
    """The draft must speak the target's vocabulary and hold every position the target drafts at.

    Drafts never reach past a request's prompt + max_tokens (the planner cuts k to the tokens left),
    which admission keeps within the target's max_seq_len: the draft needs that max_seq_len, no more
    (a cpu build records the target's as trtllm-build does, max_draft_len included, and builds its
    draft with the same)."""
    field = f"{SPECULATIVE_KEY}.draft_engine_dir"
    if draft_vocab_size != target_vocab_size:
        raise EngineConfigError(field, f"draft vocab_size {draft_vocab_size} differs from the target's {target_vocab_size}")
    for name in TOKENIZER_FILES:
        target_file, draft_file = target_dir / name, draft_dir / name
        if target_file.is_file() and draft_file.is_file() and _digest(target_file) != _digest(draft_file):
            raise EngineConfigError(field, f"the draft's {name} differs from the target's: the draft must share the target's tokenizer")
    draft_len = draft_build_config.get("max_seq_len")
    if not isinstance(draft_len, int) or draft_len < target_max_seq_len:
        raise EngineConfigError(
            f"{field} build_config.max_seq_len",
            f"{draft_len!r} cannot hold the target's max_seq_len {target_max_seq_len} (the longest sequence the draft extends)",
        )


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_speculative_section(
    engine_dir: Path,
    kind: str,
    max_draft_len: int,
    draft_engine_dir: str | None = None,
    max_matching_ngram_size: int = DEFAULT_MAX_MATCHING_NGRAM_SIZE,
    draft_vocab_size: int | None = None,
) -> None:
    """Mark a CPU engine directory as built for speculation (tests, benchmarks): the contract's
    `refengine_speculative` key plus TensorRT-LLM's build_config fields, as the cpu build writes them."""
    import json

    path = engine_dir / "config.json"
    config = json.loads(path.read_text())
    config["build_config"]["max_draft_len"] = max_draft_len
    config["build_config"]["speculative_decoding_mode"] = MODE_DRAFT_TOKENS_EXTERNAL
    section: dict[str, Any] = {"kind": kind, "max_draft_len": max_draft_len}
    if kind == "draft_model":
        section["draft_engine_dir"] = draft_engine_dir
        if draft_vocab_size is not None:
            section["draft_vocab_size"] = draft_vocab_size
    else:
        section["max_matching_ngram_size"] = max_matching_ngram_size
    config[SPECULATIVE_KEY] = section
    path.write_text(json.dumps(config, indent=2) + "\n")
