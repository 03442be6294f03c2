"""The overhead benchmark's environment: the server's environment variables, the served repository's
own code and engine settings, and the engine's metrics at the end."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import urllib.request
from pathlib import Path
from typing import Any


class bench_environment:
    """Set environment variables for the `with` block (the server inherits them at start)."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for key, value in self.values.items():
            self.saved[key] = os.environ.get(key)
            os.environ[key] = value

    def __exit__(self, *exc_info: object) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and the like look their module up
    spec.loader.exec_module(module)
    return module


_PARAMETER = re.compile(r'key:\s*"([^"]+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"\s*\}')


def engine_settings(repo: Path) -> dict[str, Any]:
    """The engine overrides the served `tensorrt_llm` model applies (as its `initialize` does)."""
    parameters = dict(_PARAMETER.findall((repo / "tensorrt_llm" / "config.pbtxt").read_text()))

    def boolean(key: str) -> bool:
        return parameters.get(key, "false").strip().lower() in ("true", "1", "yes", "on")

    return {
        "scheduler_policy": parameters.get("batch_scheduler_policy", "guaranteed_no_evict"),
        "enable_chunked_context": boolean("enable_chunked_context"),
        "enable_prefix_caching": boolean("enable_kv_cache_reuse"),
        "stream_interval": int(parameters.get("stream_interval", "1")),
    }


def engine_metrics(metrics_url: str) -> dict[str, float]:
    try:
        with urllib.request.urlopen(metrics_url, timeout=10) as response:
            text = response.read().decode()
    except Exception:  # a figure for the record only
        return {}
    values = {}
    for line in text.splitlines():
        if line.startswith(("nv_trt_llm_", "nv_inference_request_success{")):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values
