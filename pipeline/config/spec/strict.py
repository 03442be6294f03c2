"""The base of every section of the spec (frozen, and unknown keys are errors), and how to tell a section field."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=False)


def section_model(annotation: Any) -> type[BaseModel] | None:
    """The model of a section field: `Model` or `Model | None`."""
    candidates = [annotation, *get_args(annotation)]
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None
