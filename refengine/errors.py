"""Errors raised by the reference engine.

Every error the engine raises on purpose derives from `RefEngineError`, so a caller (the
Triton model, the pipeline's CPU backend) can tell a refused request or an unloadable model
from a bug.
"""

from __future__ import annotations


class RefEngineError(Exception):
    """Base class of every error the reference engine raises deliberately."""


class ModelLoadError(RefEngineError):
    """A checkpoint or engine directory cannot be loaded (bad config, missing or mis-shaped tensor)."""


class EngineConfigError(RefEngineError, ValueError):
    """An engine setting is invalid (e.g. a non-positive `max_num_tokens`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class InvalidRequestError(RefEngineError, ValueError):
    """A request is refused before it enters the engine; `field` names the offending input."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
