"""Speculative decoding in a cpu engine directory: what the build writes for refengine to speculate with.

The contract with refengine (which reads it):

    config.json  build_config.max_draft_len = K, build_config.speculative_decoding_mode = TensorRT-LLM's flag value,
                 and at the top level
                 "refengine_speculative": {"kind": "draft_model" | "ngram" | "medusa", "max_draft_len": K,
                                           "draft_engine_dir": "draft",            (draft_model only)
                                           "draft_vocab_size": N,                  (draft_model, if the spec sets it)
                                           "max_matching_ngram_size": N,           (ngram only)
                                           "medusa_heads": "medusa/medusa_lm_head.safetensors",   (medusa only,
                                           "num_medusa_heads": K, "num_medusa_layers": L,          the heads' config
                                           "medusa_choices": [[0], [0, 0], ...],                    and the tree)
                                           "medusa_vocab_size": M}     (medusa, if the spec sets it)
    draft/       (draft_model) the draft's own cpu engine directory, relative to the engine directory
    medusa/      (medusa) the heads' medusa_lm_head.safetensors and config.json, copied
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from pipeline.config.spec import SpeculativeMode, SpeculativeSpec
from pipeline.config.spec.speculative_heads import MEDUSA_CONFIG_FILE, MEDUSA_HEADS_FILE, MedusaSpec
from pipeline.errors import StageError

__all__ = ["SPECULATIVE_KEY", "DRAFT_ENGINE_DIR", "MEDUSA_DIR", "add_speculation", "speculative_record"]

SPECULATIVE_KEY = "refengine_speculative"
DRAFT_ENGINE_DIR = "draft"
MEDUSA_DIR = "medusa"
_KINDS = {SpeculativeMode.draft_tokens_external: "draft_model", SpeculativeMode.prompt_lookup: "ngram", SpeculativeMode.medusa: "medusa"}


def speculative_record(speculative: SpeculativeSpec) -> dict[str, Any]:
    """The `refengine_speculative` entry of a cpu engine's config.json."""
    kind = _KINDS.get(speculative.mode)
    if kind is None:  # the spec refuses the other modes on the cpu target
        raise StageError(f"build.speculative.mode {speculative.mode.value} is not built by the cpu target")
    record: dict[str, Any] = {"kind": kind, "max_draft_len": speculative.draft_len}
    if kind == "draft_model":
        record["draft_engine_dir"] = DRAFT_ENGINE_DIR
        if speculative.draft_vocab_size is not None:
            record["draft_vocab_size"] = speculative.draft_vocab_size
    elif kind == "ngram":
        record["max_matching_ngram_size"] = speculative.prompt_lookup.max_matching_ngram_size
    return record


def _medusa_record(medusa: MedusaSpec) -> dict[str, Any]:
    """The heads' part of the record, from their config.json (validate checked it against the file)."""
    try:
        config = json.loads((medusa.heads / MEDUSA_CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StageError(f"build.speculative.medusa.heads: cannot read {medusa.heads / MEDUSA_CONFIG_FILE} ({exc})") from None
    record: dict[str, Any] = {
        "medusa_heads": f"{MEDUSA_DIR}/{MEDUSA_HEADS_FILE}",
        "num_medusa_heads": config["medusa_num_heads"],
        "num_medusa_layers": config["medusa_num_layers"],
        "medusa_choices": medusa.tree,
    }
    if medusa.vocab_size is not None:
        record["medusa_vocab_size"] = medusa.vocab_size
    return record


def _copy_heads(medusa: MedusaSpec, engine_dir: Path) -> None:
    target = engine_dir / MEDUSA_DIR
    target.mkdir(parents=True, exist_ok=True)
    for name in (MEDUSA_HEADS_FILE, MEDUSA_CONFIG_FILE):
        if not (medusa.heads / name).is_file():
            raise StageError(f"build.speculative.medusa.heads: {medusa.heads} has no {name}")
        shutil.copyfile(medusa.heads / name, target / name)


def add_speculation(engine_dir: Path, speculative: SpeculativeSpec | None, draft_engine_dir: Path | None, *, max_seq_len: int) -> dict[str, Any]:
    """Copy the draft's cpu engine directory to <engine_dir>/draft and record `refengine_speculative`; returns the build
    notes. `max_seq_len` is the engine's (the draft must hold it: the sequences it extends)."""
    if speculative is None:
        return {}
    record = speculative_record(speculative)
    if record["kind"] == "draft_model":
        if draft_engine_dir is None or not (draft_engine_dir / "config.json").is_file():
            raise StageError(f"build.speculative.draft: the draft stage left no cpu engine directory ({draft_engine_dir})")
        draft_config = json.loads((draft_engine_dir / "config.json").read_text())
        draft_seq_len = draft_config["build_config"]["max_seq_len"]
        if draft_seq_len < max_seq_len:
            raise StageError(
                f"build.speculative.draft: the draft engine's max_seq_len ({draft_seq_len}) is below the engine's ({max_seq_len}, max_draft_len included)"
            )
        shutil.copytree(draft_engine_dir, engine_dir / DRAFT_ENGINE_DIR)
    if record["kind"] == "medusa" and speculative.medusa is not None:
        record.update(_medusa_record(speculative.medusa))
        _copy_heads(speculative.medusa, engine_dir)
    config_path = engine_dir / "config.json"
    config = json.loads(config_path.read_text())
    config[SPECULATIVE_KEY] = record
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return {"speculative": record}
