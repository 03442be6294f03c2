"""Speculative cpu-target repositories for the serving tests, laid out as `run <config> --until package` lays them
out, from the session's shared tiny-cpu checkpoint (no second export runs).

- draft-target (build_configs/tiny-cpu-draft-target.yaml): the draft is the target's first two layers with its final
  norm and lm_head (an early-exit draft: same tokenizer, cheap, agrees with the target often, not always — so drafts
  are both accepted and rolled back).
- Medusa (build_configs/tiny-cpu-medusa.yaml): the trained heads of models/tiny-stdlib-llama-medusa with the
  YAML's 5-node tree and its 1024-token vocabulary cut.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.config.spec import Spec
from tests.support.serving import REPO

DRAFT_LAYERS = 2
MEDUSA_HEADS = REPO / "models" / "tiny-stdlib-llama-medusa"


def shared_checkpoint(shared: dict[str, Path]) -> Path:
    from pipeline.stages.quantize import CHECKPOINT_DIR

    [checkpoint] = shared["root"].glob(f"tiny-cpu/quantize-*/{CHECKPOINT_DIR}")
    return checkpoint


def _early_exit_checkpoint(checkpoint: Path, out: Path, num_layers: int) -> Path:
    """The checkpoint's first `num_layers` layers as a checkpoint of its own (weights linked; the rest unread)."""
    out.mkdir(parents=True)
    for path in checkpoint.iterdir():
        if path.name != "config.json":
            os.symlink(path.resolve(), out / path.name)
    config = json.loads((checkpoint / "config.json").read_text())
    config["num_hidden_layers"] = num_layers
    (out / "config.json").write_text(json.dumps(config))
    return out


def build_speculative_repository(shared: dict[str, Path], work: Path) -> Path:
    """engine (with draft/) and model repository, as `run tiny-cpu-draft-target.yaml --until package` lays them out."""
    from pipeline.backends.cpu.target import cpu_build_config, write_cpu_engine
    from pipeline.config.loader import load_config
    from pipeline.config.spec.draft import draft_spec

    spec = load_config(REPO / "build_configs" / "tiny-cpu-draft-target.yaml").spec
    checkpoint = shared_checkpoint(shared)
    draft = draft_spec(spec)
    draft_dir = work / "draft-engine"
    write_cpu_engine(
        _early_exit_checkpoint(checkpoint, work / "draft-checkpoint", DRAFT_LAYERS),
        draft_dir,
        build_config=cpu_build_config(draft.build, max_seq_len=draft.build.max_seq_len, dtype=draft.model.dtype.value),
        version="test",
    )
    return _package(spec, checkpoint, draft_dir, shared["tokenizer"], work)


def _package(spec: Spec, checkpoint: Path, draft_dir: Path | None, tokenizer_dir: Path, work: Path) -> Path:
    """The spec's speculative cpu engine over `checkpoint` (`draft_dir`: its draft's engine) and its model repository."""
    from pipeline.backends.cpu.speculative import add_speculation
    from pipeline.backends.cpu.target import cpu_build_config, write_cpu_engine
    from pipeline.render import RepositoryRequest, render_model_repository

    engine_dir = work / "engine"
    build_config = cpu_build_config(spec.build, max_seq_len=spec.build.max_seq_len, dtype=spec.model.dtype.value)
    write_cpu_engine(checkpoint, engine_dir, build_config=build_config, version="test")
    add_speculation(engine_dir, spec.build.speculative, draft_dir, max_seq_len=build_config["max_seq_len"])
    repository = work / "model_repository"
    render_model_repository(
        RepositoryRequest(
            engine_dir=engine_dir, tokenizer_dir=tokenizer_dir, serve=spec.serve, target="cpu", out_dir=repository, speculative=spec.build.speculative
        )
    )
    return repository


def medusa_num_heads() -> int:
    """The number of heads of the Medusa build (the shipped heads')."""
    return int(json.loads((MEDUSA_HEADS / "config.json").read_text())["medusa_num_heads"])


def build_medusa_repository(shared: dict[str, Path], work: Path) -> Path:
    """engine (with medusa/) and model repository of tiny-cpu-medusa.yaml (the shipped heads, the YAML's tree and vocabulary cut)."""
    from pipeline.config.loader import load_config

    spec = load_config(REPO / "build_configs" / "tiny-cpu-medusa.yaml").spec
    return _package(spec, shared_checkpoint(shared), None, shared["tokenizer"], work)
