"""The recipe recorded with every overhead result: the call, the machine, the versions, the server,
the engine and the clients, so a figure can be read (and re-run) without the code at hand."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from bench.overhead.records import InProcessSetup, OverheadOptions, ServerSitting

_REPO_ROOT = Path(__file__).resolve().parents[2]
DECODING = "greedy (temperature 0; server: runtime_top_k = runtime_top_p = 0 defaults), end id = tokenizer eos"
CLIENTS = {
    "http": "http.client keep-alive connection per caller, JSON body {text_input, max_tokens}",
    "grpc": "tritonclient.grpc, one open stream per caller, requests one after another, enable_empty_final_response",
    "latency": "client side: request sent → final response (gRPC: the response flagged triton_final_response)",
}


def recipe(
    options: OverheadOptions, local: InProcessSetup, sitting: ServerSitting, *, dirs: dict[str, Path], deploy: Any, torch_threads: int
) -> dict[str, Any]:
    """`dirs`: the repository, engine and tokenizer directories (keys repo, engine_dir, tokenizer_dir);
    `torch_threads`: the intra-op threads this process measured with."""
    return {
        "call": _call(options),
        "counts": options.counts(),
        "machine": {"cpu": _cpu_model(), "cpu_count": os.cpu_count(), "platform": platform.platform(), "gpu": None},
        "versions": _versions(sitting.server_version),
        "torch_threads": {"this_process": torch_threads, "server_stub": _server_stub_threads(options.torch_threads)},
        "server": _server(sitting, deploy),
        "paths": {key: str(path) for key, path in dirs.items()},
        "engine": _engine(local),
        "prompt": options.prompt,
        "prompt_tokens": len(local.prompt_ids),
        "decoding": DECODING,
        "clients": CLIENTS,
    }


def _call(options: OverheadOptions) -> str:
    counts = options.counts()
    return (
        f"run_serve_bench(repo, engine_dir, tokenizer_dir, deploy, requests={counts['requests']}, warmup={counts['warmup']}, "
        f"concurrency={counts['concurrency']}, stream_tokens={counts['stream_tokens']}, stream_requests={counts['stream_requests']}, "
        f"stream_warmup={counts['stream_warmup']}, rounds={counts['rounds']}, stream_rounds={counts['stream_rounds']}, "
        f"include_bls={counts['include_bls']}, torch_threads={options.torch_threads})"
    )


def _versions(server_version: str | None) -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "tritonclient": _version("tritonclient"),
        "nvidia-pytriton": _version("nvidia-pytriton"),
        "tritonserver": server_version,
        "tokenizers": _version("tokenizers"),
        "numpy": _version("numpy"),
        "trtllm-pipeline": _version("trtllm-pipeline"),
        **{f"git_{key}": value for key, value in _git().items()},
    }


def _server_stub_threads(torch_threads: int | None) -> str:
    if torch_threads is not None:
        return f"OMP_NUM_THREADS={torch_threads}"
    inherited = f" (OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']})" if "OMP_NUM_THREADS" in os.environ else ""
    return "torch default in the same environment" + inherited


def _server(sitting: ServerSitting, deploy: Any) -> dict[str, Any]:
    options = sitting.server_options
    return {
        "bind_address": options.bind_address,
        "ports": {"http": options.http_port, "grpc": options.grpc_port, "metrics": options.metrics_port},
        "startup_s": round(sitting.startup_s, 2),
        "shm_prefix": options.shm_prefix,
        "deploy": deploy.model_dump(mode="json") if hasattr(deploy, "model_dump") else str(deploy),
    }


def _engine(local: InProcessSetup) -> dict[str, Any]:
    config = local.engine.config
    model = local.engine._model.config if hasattr(local.engine, "_model") else None
    return {
        **{key: getattr(config, key, None) for key in ("max_batch_size", "max_num_tokens", "max_seq_len", "tokens_per_block", "compute_dtype")},
        **local.engine_settings,
        "model_layers": getattr(model, "num_layers", None),
        "model_hidden": getattr(model, "hidden_size", None),
        "model_vocab": getattr(model, "vocab_size", None),
    }


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
