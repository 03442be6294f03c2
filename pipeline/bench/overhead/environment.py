"""The serving benchmark's environment: ports, versions, engine settings, the recipe recorded with every result."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

_REPO_ROOT = Path(__file__).resolve().parents[3]


# -- helpers -----------------------------------------------------------------------------------
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


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git() -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_REPO_ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=_REPO_ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        return {"commit": commit or None, "uncommitted_changes": bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "uncommitted_changes": None}


def recipe(*, repo, engine_dir, tokenizer_dir, deploy, options, engine, engine_settings, prompt, prompt_ids, counts,
            server_version, startup_s, torch_threads, torch_threads_arg) -> dict[str, Any]:
    config = engine.config
    model = engine._model.config if hasattr(engine, "_model") else None
    return {
        "call": (
            f"run_serve_bench(repo, engine_dir, tokenizer_dir, deploy, requests={counts['requests']}, warmup={counts['warmup']}, "
            f"concurrency={counts['concurrency']}, stream_tokens={counts['stream_tokens']}, stream_requests={counts['stream_requests']}, "
            f"stream_warmup={counts['stream_warmup']}, rounds={counts['rounds']}, stream_rounds={counts['stream_rounds']}, "
            f"include_bls={counts['include_bls']}, torch_threads={torch_threads_arg})"
        ),
        "counts": counts,
        "machine": {
            "cpu": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "gpu": None,
        },
        "versions": {
            "python": platform.python_version(),
            "torch": _version("torch"),
            "tritonclient": _version("tritonclient"),
            "nvidia-pytriton": _version("nvidia-pytriton"),
            "tritonserver": server_version,
            "tokenizers": _version("tokenizers"),
            "numpy": _version("numpy"),
            "trtllm-pipeline": _version("trtllm-pipeline"),
            **{f"git_{key}": value for key, value in _git().items()},
        },
        "torch_threads": {
            "this_process": torch_threads,
            "server_stub": (
                f"OMP_NUM_THREADS={torch_threads_arg}" if torch_threads_arg is not None
                else "torch default in the same environment"
                + (f" (OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']})" if "OMP_NUM_THREADS" in os.environ else "")
            ),
        },
        "server": {
            "bind_address": options.bind_address,
            "ports": {"http": options.http_port, "grpc": options.grpc_port, "metrics": options.metrics_port},
            "startup_s": round(startup_s, 2),
            "shm_prefix": options.shm_prefix,
            "deploy": deploy.model_dump(mode="json") if hasattr(deploy, "model_dump") else str(deploy),
        },
        "paths": {
            "repo": str(repo), "engine_dir": str(engine_dir), "tokenizer_dir": str(tokenizer_dir),
        },
        "engine": {
            **{key: getattr(config, key, None) for key in ("max_batch_size", "max_num_tokens", "max_seq_len", "tokens_per_block", "compute_dtype")},
            **engine_settings,
            "model_layers": getattr(model, "num_layers", None),
            "model_hidden": getattr(model, "hidden_size", None),
            "model_vocab": getattr(model, "vocab_size", None),
        },
        "prompt": prompt,
        "prompt_tokens": len(prompt_ids),
        "decoding": "greedy (temperature 0; server: runtime_top_k = runtime_top_p = 0 defaults), end id = tokenizer eos",
        "clients": {
            "http": "http.client keep-alive connection per caller, JSON body {text_input, max_tokens}",
            "grpc": "tritonclient.grpc, one open stream per caller, requests one after another, enable_empty_final_response",
            "latency": "client side: request sent → final response (gRPC: the response flagged triton_final_response)",
        },
    }
