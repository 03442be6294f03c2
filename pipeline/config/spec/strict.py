"""The base of every section of the spec: frozen, and unknown keys are errors."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=False)
