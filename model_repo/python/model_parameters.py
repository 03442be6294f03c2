"""Typed access to the `parameters` of a Triton model config, as the Python models receive it.

`args["model_config"]` is the config as JSON: `{"parameters": {"key": {"string_value": "..."}}}`.
Paths may be relative; they are resolved against the model repository's root directory, so a
repository that carries its engine and tokenizer next to it can be moved as a whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


class ParameterError(ValueError):
    """A model parameter is missing or malformed (the model refuses to load)."""


class ModelParameters:
    def __init__(self, model_config: Mapping[str, Any], model_directory: str | Path) -> None:
        self._values = {key: str(value.get("string_value", "")) for key, value in (model_config.get("parameters") or {}).items()}
        self._model_name = model_config.get("name", "?")
        self._repository_root = Path(model_directory).resolve().parent

    def string(self, key: str, default: str | None = None) -> str:
        value = self._values.get(key, "")
        if value == "":
            if default is None:
                raise ParameterError(f"model {self._model_name!r}: parameter {key!r} is required")
            return default
        return value

    def integer(self, key: str, default: int | None = None) -> int:
        raw = self.string(key, None if default is None else str(default))
        try:
            return int(raw)
        except ValueError:
            raise ParameterError(f"model {self._model_name!r}: parameter {key!r} must be an integer, got {raw!r}") from None

    def boolean(self, key: str, default: bool | None = None) -> bool:
        raw = self.string(key, None if default is None else str(default)).strip().lower()
        if raw in _TRUE:
            return True
        if raw in _FALSE:
            return False
        raise ParameterError(f"model {self._model_name!r}: parameter {key!r} must be true or false, got {raw!r}")

    def path(self, key: str) -> Path:
        path = Path(self.string(key))
        return path if path.is_absolute() else (self._repository_root / path).resolve()
