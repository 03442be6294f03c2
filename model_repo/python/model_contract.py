"""A Python model's tensor contract: the `contract.json` the package stage writes next to its code.

The file is rendered from the project's one source of the contract (pipeline/render/contract.py,
which renders config.pbtxt too), so a model reads the tensor names it serves from here instead of
carrying a copy. It lies in the model's version directory, with the code that reads it: Triton
passes the model's directory as `args["model_repository"]` and the version as `args["model_version"]`.
Pure (json only): importable outside Triton, never imports `pipeline`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTRACT_FILE = "contract.json"


class ContractFileError(ValueError):
    """contract.json is missing or malformed (the model refuses to load)."""


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str  # Triton TYPE_* name, as in config.pbtxt
    dims: tuple[int, ...]
    optional: bool


@dataclass(frozen=True)
class ModelContract:
    path: Path
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    wiring: Mapping[str, Mapping[str, str]]  # name → {tensor → tensor}: how a BLS wires the models it calls

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(tensor.name for tensor in self.inputs)

    def wiring_map(self, name: str) -> dict[str, str]:
        if name not in self.wiring:
            raise ContractFileError(f"{self.path}: no wiring {name!r} (it has: {', '.join(sorted(self.wiring)) or 'none'})")
        return dict(self.wiring[name])


def contract_path(model_directory: str | Path, model_version: str | int) -> Path:
    return Path(model_directory) / str(model_version) / CONTRACT_FILE


def load_model_contract(model_directory: str | Path, model_version: str | int) -> ModelContract:
    """The contract of the model in `model_directory` (Triton's `args["model_repository"]`), version `model_version`."""
    path = contract_path(model_directory, model_version)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ContractFileError(f"{path} is missing: the package stage writes it next to the model's code") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ContractFileError(f"{path} cannot be read as JSON: {error}") from None
    if not isinstance(document, dict):
        raise ContractFileError(f"{path}: expected a JSON object, got {type(document).__name__}")
    return ModelContract(
        path=path,
        inputs=_tensors(document, "inputs", path),
        outputs=_tensors(document, "outputs", path),
        wiring=_wiring(document.get("wiring", {}), path),
    )


def _tensors(document: Mapping[str, Any], key: str, path: Path) -> tuple[Tensor, ...]:
    entries = document.get(key)
    if not isinstance(entries, list):
        raise ContractFileError(f"{path}: {key!r} must be a list of tensors")
    tensors = []
    for index, entry in enumerate(entries):
        where = f"{path}: {key}[{index}]"
        if not isinstance(entry, dict):
            raise ContractFileError(f"{where} must be an object")
        name, data_type, dims, optional = (entry.get(field) for field in ("name", "data_type", "dims", "optional"))
        if not isinstance(name, str) or not name:
            raise ContractFileError(f"{where}: 'name' must be a non-empty string")
        if not isinstance(data_type, str) or not data_type.startswith("TYPE_"):
            raise ContractFileError(f"{where} ({name}): 'data_type' must be a Triton TYPE_* name, got {data_type!r}")
        if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
            raise ContractFileError(f"{where} ({name}): 'dims' must be a list of integers, got {dims!r}")
        if not isinstance(optional, bool):
            raise ContractFileError(f"{where} ({name}): 'optional' must be true or false, got {optional!r}")
        tensors.append(Tensor(name, data_type, tuple(dims), optional))
    return tuple(tensors)


def _wiring(wiring: Any, path: Path) -> dict[str, dict[str, str]]:
    if not isinstance(wiring, dict):
        raise ContractFileError(f"{path}: 'wiring' must be an object")
    for name, mapping in wiring.items():
        if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
            raise ContractFileError(f"{path}: wiring {name!r} must map tensor names to tensor names")
    return {name: dict(mapping) for name, mapping in wiring.items()}
