"""The backend of each build target, imported when first asked for (some pull in TensorRT-LLM tooling)."""

from __future__ import annotations

import importlib
from functools import cache

from pipeline.backends.base import TargetBackend
from pipeline.config.spec import Target

_MODULES: dict[Target, str] = {
    Target.engine: "pipeline.backends.engine.target",
    Target.cpu: "pipeline.backends.cpu.target",
    Target.llmapi: "pipeline.backends.llmapi.target",
}


@cache
def backend_for(target: Target) -> TargetBackend:
    return importlib.import_module(_MODULES[Target(target)]).BACKEND
