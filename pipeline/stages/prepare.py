"""prepare: validate a local Hugging Face checkpoint and record it in the artifact store.

Configs and tokenizer files are copied into the artifact. The weights are copied too with
`model.copy_weights` (a reflink where the file system can make one); by default they stay in
`model.source` and the artifact records each file's size and SHA-256 (`source-weights.json`):
`checkpoint_dir` hands a stage the directory to read the checkpoint from, after checking the
source still holds exactly those files. Nothing is hard-linked or symlinked: a write into the store
never reaches the user's checkpoint (root ignores read-only modes, so modes would not protect it).
"""

from __future__ import annotations

import fcntl
import json
import shutil
from pathlib import Path

from safetensors import safe_open

from pipeline.artifacts import MANIFEST
from pipeline.errors import StageError
from pipeline.hashing import file_hashes
from pipeline.stages.base import StageContext

_CONFIG_FILES = ("config.json", "generation_config.json", "hf_quant_config.json")  # the last: ModelOpt's quantization record
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
    small = [*_CONFIG_FILES, *_TOKENIZER_FILES, "model.safetensors.index.json"]
    for name in small:
        if (source / name).is_file():
            copy_file(source / name, ctx.out_dir / name)
    if ctx.spec.model.copy_weights:
        for name in info.weight_files:
            copy_file(source / name, ctx.out_dir / name)
    else:
        record = {"source": str(source), "files": {name: _describe(source / name) for name in info.weight_files}}
        (ctx.out_dir / SOURCE_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    num_parameters = sum(n for n, _ in tensors.values())
    summary = {
        "model_type": info.model_type,
        "architecture": info.architecture,
        "num_parameters": num_parameters,
        "weight_dtypes": sorted({dtype for _, dtype in tensors.values()}),
        "num_tensors": len(tensors),
        "source": str(source),
    }
    (ctx.out_dir / "prepare.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    ctx.log(f"{num_parameters / 1e6:.2f} M parameters in {len(info.weight_files)} safetensors file(s)")


def _prepare_config_only(ctx: StageContext) -> None:
    """Dry run of the engine target: the model's config.json (and tokenizer, if any) is all that is needed."""
    source = ctx.model.path
    copied = [name for name in (*_CONFIG_FILES, *_TOKENIZER_FILES) if (source / name).is_file()]
    for name in copied:
        copy_file(source / name, ctx.out_dir / name)
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


SOURCE_RECORD = "source-weights.json"


def checkpoint_dir(prepared: Path) -> Path:
    """The Hugging Face checkpoint directory of a prepare artifact: the artifact itself when it holds
    the weights, else the source, once its weight files are checked against the record (through the
    hash cache: a stat per file unless one changed) and its configs against the artifact's copies."""
    record_path = prepared / SOURCE_RECORD
    if not record_path.is_file():
        return prepared
    record = json.loads(record_path.read_text())
    source = Path(record["source"])
    hashes = file_hashes()
    changed = []
    for name, entry in record["files"].items():
        path = source / name
        if not path.is_file():
            changed.append(f"{name} is gone")
        elif path.stat().st_size != entry["size"] or hashes.sha256(path) != entry["sha256"]:
            changed.append(f"{name} changed")
    for copied in sorted(prepared.iterdir()):
        original = source / copied.name
        if copied.name not in (SOURCE_RECORD, "prepare.json", MANIFEST) and copied.is_file():
            if not original.is_file() or hashes.sha256(original) != hashes.sha256(copied):
                changed.append(f"{copied.name} changed")
    if changed:
        raise StageError(
            f"the source checkpoint {source} changed since it was prepared: {'; '.join(changed)}",
            hint="run again: the plan sees the new content and prepares it anew (or set model.copy_weights: true to keep a copy)",
        )
    return source


def copy_file(src: Path, dst: Path) -> None:
    """A copy that shares no inode with `src`: a reflink (copy-on-write clone) where the file system
    makes one, else an in-kernel copy."""
    with open(src, "rb") as reader, open(dst, "wb") as writer:
        try:
            fcntl.ioctl(writer.fileno(), _FICLONE, reader.fileno())
            cloned = True
        except OSError:
            cloned = False
    if not cloned:
        shutil.copyfile(src, dst)  # copy_file_range / sendfile on Linux
    shutil.copystat(src, dst)


_FICLONE = 0x40049409  # linux/fs.h: clone a whole file (btrfs, XFS with reflink, ...)


def _describe(path: Path) -> dict:
    return {"size": path.stat().st_size, "sha256": file_hashes().sha256(path)}
