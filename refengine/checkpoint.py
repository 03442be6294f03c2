"""Reading TensorRT-LLM checkpoints and CPU engine directories.

A checkpoint directory is `config.json` (TensorRT-LLM PretrainedConfig) + `rank{N}.safetensors`
with TensorRT-LLM tensor names (NVIDIA/TensorRT-LLM docs/source/architecture/checkpoint.md). A CPU engine directory has the
`config.json` of a TensorRT-LLM 1.2 engine (`version`, `pretrained_config`, `build_config`) and
the weights as `rank0.safetensors`, in the same names. Only world_size 1 is read.

Tensors are fetched by name through `TensorStore.get`, which checks presence and shape and
raises `ModelLoadError` naming the tensor; the model builder asks for what it needs, so a
quantized Linear can later ask for its own tensors (scales, packed weights) the same way.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from refengine.errors import ModelLoadError
from refengine.model_config import ModelConfig

CONFIG_FILE = "config.json"
RANK0_WEIGHTS_FILE = "rank0.safetensors"
FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})


class TensorStore:
    """The tensors of one rank, looked up by TensorRT-LLM name with shape checks."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], source: str) -> None:
        self._tensors = dict(tensors)
        self._source = source

    @classmethod
    def from_safetensors(cls, path: Path) -> TensorStore:
        if not path.is_file():
            raise ModelLoadError(f"weights file {path} does not exist")
        try:
            tensors = load_file(str(path))
        except (SafetensorError, OSError) as error:
            raise ModelLoadError(f"cannot read weights file {path}: {error}") from error
        return cls(tensors, str(path))

    @property
    def source(self) -> str:
        return self._source

    def names(self) -> list[str]:
        return sorted(self._tensors)

    def has(self, name: str) -> bool:
        return name in self._tensors

    def get(self, name: str, expected_shape: tuple[int, ...], *, floating: bool = True) -> torch.Tensor:
        """The tensor `name`; raises `ModelLoadError` if it is missing or has another shape."""
        if name not in self._tensors:
            raise ModelLoadError(f"tensor {name!r} (expected shape {tuple(expected_shape)}) is missing from {self._source}")
        return self._checked(name, expected_shape, floating)

    def get_optional(self, name: str, expected_shape: tuple[int, ...], *, floating: bool = True) -> torch.Tensor | None:
        """Like `get`, but `None` when the tensor is absent (e.g. an optional bias)."""
        if name not in self._tensors:
            return None
        return self._checked(name, expected_shape, floating)

    def get_scalar(self, name: str) -> torch.Tensor:
        """A per-tensor scale (shape [] or [1], floating) as a 0-dim float32 tensor."""
        if name not in self._tensors:
            raise ModelLoadError(f"tensor {name!r} (a scalar scale) is missing from {self._source}")
        tensor = self._tensors[name]
        if tensor.dim() > 1 or tensor.numel() != 1:
            raise ModelLoadError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected a scalar ([] or [1]) (in {self._source})")
        if tensor.dtype not in FLOAT_DTYPES:
            raise ModelLoadError(f"tensor {name!r} has dtype {tensor.dtype}, expected a float scale (in {self._source})")
        return tensor.reshape(()).to(torch.float32)

    def get_quantized(self, name: str, expected_shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
        """Like `get` for quantized codes: the dtype must be one of `dtypes`."""
        tensor = self.get(name, expected_shape, floating=False)
        if tensor.dtype not in dtypes:
            expected = "/".join(str(dtype).removeprefix("torch.") for dtype in dtypes)
            raise ModelLoadError(f"tensor {name!r} has dtype {tensor.dtype}, expected {expected} (in {self._source})")
        return tensor

    def _checked(self, name: str, expected_shape: tuple[int, ...], floating: bool) -> torch.Tensor:
        tensor = self._tensors[name]
        if tuple(tensor.shape) != tuple(expected_shape):
            raise ModelLoadError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(expected_shape)} (in {self._source})")
        if floating and tensor.dtype not in FLOAT_DTYPES:
            raise ModelLoadError(
                f"tensor {name!r} has dtype {tensor.dtype}, expected float16/bfloat16/float32 "
                f"(in {self._source}); quantized weights need a matching quantization.quant_algo"
            )
        return tensor


@dataclass(frozen=True)
class Checkpoint:
    """A parsed model: its config (raw and checked) and its tensors."""

    directory: Path
    raw_config: Mapping[str, Any]
    config: ModelConfig
    tensors: TensorStore


@dataclass(frozen=True)
class EngineDirectory:
    """A CPU engine directory: the checkpoint plus the build limits and the builder's version."""

    directory: Path
    version: str | None
    build_config: Mapping[str, Any]
    checkpoint: Checkpoint
    raw_config: Mapping[str, Any] = field(default_factory=dict)  # the whole config.json


def load_checkpoint(directory: str | Path) -> Checkpoint:
    """Read a TensorRT-LLM checkpoint directory (`config.json` + `rank0.safetensors`)."""
    directory = Path(directory)
    raw_config = _read_json_object(directory / CONFIG_FILE)
    return _checkpoint_from(directory, raw_config)


def load_engine_dir(directory: str | Path) -> EngineDirectory:
    """Read a CPU engine directory (`config.json` with `pretrained_config`/`build_config`)."""
    directory = Path(directory)
    raw = _read_json_object(directory / CONFIG_FILE)
    for key in ("pretrained_config", "build_config"):
        if not isinstance(raw.get(key), Mapping):
            raise ModelLoadError(
                f"{directory / CONFIG_FILE} has no {key!r} object; is this an engine directory? (a checkpoint directory is read with load_checkpoint)"
            )
    return EngineDirectory(
        directory=directory,
        version=raw.get("version"),
        build_config=raw["build_config"],
        checkpoint=_checkpoint_from(directory, raw["pretrained_config"]),
        raw_config=raw,
    )


def write_engine_dir(
    checkpoint_dir: str | Path,
    engine_dir: str | Path,
    build_config: Mapping[str, Any],
    version: str,
) -> Path:
    """Write a CPU engine directory from a checkpoint: config.json (TRT-LLM 1.2 keys) + weights."""
    checkpoint = load_checkpoint(checkpoint_dir)
    engine_dir = Path(engine_dir)
    engine_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(checkpoint_dir) / RANK0_WEIGHTS_FILE, engine_dir / RANK0_WEIGHTS_FILE)
    config = {
        "version": version,
        "pretrained_config": dict(checkpoint.raw_config),
        "build_config": dict(build_config),
    }
    (engine_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return engine_dir


def _checkpoint_from(directory: Path, raw_config: Mapping[str, Any]) -> Checkpoint:
    config = ModelConfig.from_pretrained_config(raw_config)
    tensors = TensorStore.from_safetensors(directory / RANK0_WEIGHTS_FILE)
    return Checkpoint(directory=directory, raw_config=raw_config, config=config, tensors=tensors)


def _read_json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ModelLoadError(f"{path} does not exist")
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"cannot parse {path}: {error}") from error
    if not isinstance(value, dict):
        raise ModelLoadError(f"{path} must hold a JSON object, got {type(value).__name__}")
    return value
