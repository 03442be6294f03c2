"""prepare: validate a local Hugging Face checkpoint and normalize it into the artifact store."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from safetensors import safe_open

from pipeline.errors import StageError
from pipeline.stages.base import StageContext

_CONFIG_FILES = ("config.json", "generation_config.json")
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
)


def run(ctx: StageContext) -> None:
    info = ctx.model
    source = info.path
    if ctx.spec.dry_run and not info.weight_files:
        _prepare_config_only(ctx)
        return
    if not info.weight_files:
        raise StageError(
            f"{source} has no *.safetensors weights (config-only model directories can be planned, not prepared)",
            hint="point model.source at a full checkpoint saved with safe_serialization=True",
        )
    if not (source / "tokenizer.json").is_file() and not (source / "tokenizer.model").is_file():
        raise StageError(f"{source} has no tokenizer (tokenizer.json or tokenizer.model); serving needs one")
    tensors = _read_tensor_index(source, info.weight_files)
    _check_layers(tensors, info.num_layers, source)
    wanted = [*_CONFIG_FILES, *_TOKENIZER_FILES, *info.weight_files, "model.safetensors.index.json"]
    for name in wanted:
        if (source / name).is_file():
            _link_or_copy(source / name, ctx.out_dir / name)
    summary = {
        "model_type": info.model_type,
        "architecture": info.architecture,
        "num_parameters": sum(n for n, _ in tensors.values()),
        "weight_dtypes": sorted({dtype for _, dtype in tensors.values()}),
        "num_tensors": len(tensors),
        "source": str(source),
    }
    (ctx.out_dir / "prepare.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    ctx.log(f"{summary['num_parameters'] / 1e6:.2f} M parameters in {len(info.weight_files)} safetensors file(s)")


def _prepare_config_only(ctx: StageContext) -> None:
    """Dry run of the engine target: the model's config.json (and tokenizer, if any) is all that is needed."""
    source = ctx.model.path
    copied = [name for name in (*_CONFIG_FILES, *_TOKENIZER_FILES) if (source / name).is_file()]
    for name in copied:
        _link_or_copy(source / name, ctx.out_dir / name)
    summary = {"dry_run": True, "model_type": ctx.model.model_type, "architecture": ctx.model.architecture, "files": copied, "source": str(source)}
    (ctx.out_dir / "prepare.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    ctx.notes["dry_run"] = True
    ctx.log(f"dry run: {source} has no weights; kept {', '.join(copied)}")


def _read_tensor_index(source: Path, files: tuple[str, ...]) -> dict[str, tuple[int, str]]:
    tensors: dict[str, tuple[int, str]] = {}
    for name in files:
        try:
            with safe_open(source / name, framework="pt") as handle:
                for key in handle.keys():
                    sliced = handle.get_slice(key)
                    count = 1
                    for dim in sliced.get_shape():
                        count *= dim
                    tensors[key] = (count, sliced.get_dtype())
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise StageError(f"{source / name}: not a readable safetensors file ({type(exc).__name__}: {exc})") from exc
    return tensors


def _check_layers(tensors: dict[str, tuple[int, str]], num_layers: int, source: Path) -> None:
    missing = [i for i in range(num_layers) if not any(f".layers.{i}." in key for key in tensors)]
    if missing:
        raise StageError(f"{source}: config.json says {num_layers} layers but the weights have none for layer(s) {missing[:8]}")
    if not any("embed_tokens" in key for key in tensors):
        raise StageError(f"{source}: no embedding tensor (*.embed_tokens.weight) in the weights")


def _link_or_copy(src: Path, dst: Path) -> None:
    # A hard link makes large checkpoints free to prepare; the manifest still hashes the content.
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
