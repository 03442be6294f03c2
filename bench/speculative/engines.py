"""The engine directories the speculative benchmark compares, made from the built target.

A speculative variant is the target's engine directory (its weights linked, not copied) with
the `refengine_speculative` key and TensorRT-LLM's build_config fields set; a draft-target one
also holds the draft as a CPU engine directory of its own under `draft/`, whose max_seq_len
covers the target's plus the draft tokens. An engine directory that already carries the key
(a spec whose build has a speculative section) is used as it is.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from refengine.speculative.settings import SPECULATIVE_KEY, write_speculative_section

DRAFT_DIR = "draft"


def speculative_kind(engine_dir: Path) -> str | None:
    """The kind an engine directory was built for, or None."""
    section = json.loads((engine_dir / "config.json").read_text()).get(SPECULATIVE_KEY)
    return section.get("kind") if isinstance(section, dict) else None


def plain_variant(engine_dir: Path, work_dir: Path) -> Path:
    """The target without speculation (the engine as built, or a copy without the key)."""
    if speculative_kind(engine_dir) is None:
        return engine_dir
    out = linked_copy(engine_dir, work_dir / "plain")
    config = json.loads((out / "config.json").read_text())
    config.pop(SPECULATIVE_KEY)
    config["build_config"].update(max_draft_len=0, speculative_decoding_mode=1)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def ngram_variant(engine_dir: Path, work_dir: Path, max_draft_len: int, max_matching_ngram_size: int) -> Path:
    out = linked_copy(engine_dir, work_dir / "ngram")
    write_speculative_section(out, "ngram", max_draft_len, max_matching_ngram_size=max_matching_ngram_size)
    return out


def draft_variant(
    engine_dir: Path, work_dir: Path, draft_source: Path, max_draft_len: int, draft_vocab_size: int | None = None, name: str = "draft_model"
) -> Path:
    """`draft_source`: a Hugging Face model directory (exported here as the target is) or a CPU engine directory;
    `draft_vocab_size`: refengine_speculative.draft_vocab_size (draft only the first N token ids)."""
    out = linked_copy(engine_dir, work_dir / name)
    draft_dir = out / DRAFT_DIR
    target_build = json.loads((engine_dir / "config.json").read_text())["build_config"]
    if (draft_source / "rank0.safetensors").is_file():
        linked_copy(draft_source, draft_dir)
    else:
        _export_draft(draft_source, work_dir / "draft_checkpoint", draft_dir, target_build, max_draft_len)
    write_speculative_section(out, "draft_model", max_draft_len, DRAFT_DIR, draft_vocab_size=draft_vocab_size)
    return out


def _export_draft(hf_dir: Path, checkpoint_dir: Path, draft_dir: Path, target_build: dict[str, Any], max_draft_len: int) -> None:
    from pipeline.backends.cpu.target import write_cpu_engine
    from pipeline.quantization.modelopt_export import export_trtllm_checkpoint

    if not (checkpoint_dir / "rank0.safetensors").is_file():
        export_trtllm_checkpoint(hf_dir, checkpoint_dir, dtype="float16", tp_size=1, pp_size=1)
    build_config = dict(target_build, max_seq_len=target_build["max_seq_len"] + max_draft_len, max_draft_len=0, speculative_decoding_mode=1)
    write_cpu_engine(checkpoint_dir, draft_dir, build_config=build_config, version="bench-draft")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (hf_dir / name).is_file():
            shutil.copyfile(hf_dir / name, draft_dir / name)


def linked_copy(source: Path, out: Path) -> Path:
    """config.json copied (it is edited), every other file linked."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file():
            if path.name == "config.json":
                shutil.copyfile(path, out / path.name)
            else:
                os.symlink(path.resolve(), out / path.name)
    return out
