"""Does this runtime run this engine? TensorRT-LLM engines load only in the exact TensorRT-LLM
version that built them and only on the GPU architecture they were built for (the runtime checks the engine's
`version`; cross-GPU builds are not supported, NVIDIA/TensorRT-LLM issues #1803 and #1807); anything else fails deep
inside the backend with a serialization or kernel error (triton-inference-server/tensorrtllm_backend issue #531). This module compares the facts the
build recorded with the runtime's, before a server starts, and names both values.

    check_engine_runtime(EngineRecord("1.2.1", 90, "H200"), RuntimeFacts("1.1.0", "…", (90,)))
    -> EngineRuntimeMismatch: the engine was built with TensorRT-LLM 1.2.1, but this runtime has 1.1.0 …

A fact that is not known on either side (no GPU declared at build time, no `nvidia-smi`, no
`tensorrt_llm` installed) is not checked. Runtime facts: the TensorRT-LLM version from the
installed `tensorrt_llm` distribution (its `__version__` if only importable), else whatever the
caller knows (the image tag's version profile); compute capabilities from
`nvidia-smi --query-gpu=index,compute_cap`.

Standalone (standard library only) on purpose: the deploy stage copies this file into the engine
target's deployment, and the Triton container runs it as its entrypoint before NVIDIA's own:

    python3 engine_runtime.py --trtllm-version 1.2.1 --compute-capability 9.0 --gpu H200 \\
        -- /opt/nvidia/nvidia_entrypoint.sh tritonserver …

It checks, then replaces itself with the command (exit 3 and the message on stderr on a mismatch).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MISMATCH_EXIT_CODE = 3
NVIDIA_SMI_QUERY = ("nvidia-smi", "--query-gpu=index,compute_cap", "--format=csv,noheader")
_TRTLLM_DISTRIBUTIONS = ("tensorrt_llm", "tensorrt-llm")
_CC = re.compile(r"^\s*(\d+)\.(\d)\s*$")


class EngineRuntimeMismatch(Exception):
    """The engine was built for another TensorRT-LLM version or GPU architecture than this runtime's."""


@dataclass(frozen=True)
class EngineRecord:
    """What the build recorded: the TensorRT-LLM version and the GPU the engine was built for."""

    trtllm_version: str
    compute_capability: int | None = None  # SM as an integer (90 = 9.0); None: no GPU recorded
    gpu: str | None = None  # the GPU's name, for messages


@dataclass(frozen=True)
class RuntimeFacts:
    """What this runtime offers; None / () where unknown (then that fact is not checked)."""

    trtllm_version: str | None = None
    trtllm_version_source: str = ""  # where the version came from, for messages
    compute_capabilities: tuple[int, ...] = ()  # one per GPU the server would use


# -- pure checks --------------------------------------------------------------------------------
def parse_compute_capability(text: str) -> int:
    """`nvidia-smi`'s "9.0" (or "10.0", "8.9") as an integer SM: 90, 100, 89."""
    match = _CC.match(str(text))
    if match is None:
        raise ValueError(f"not a compute capability: {text!r} (expected MAJOR.MINOR, e.g. 9.0)")
    return int(match.group(1)) * 10 + int(match.group(2))


def format_compute_capability(sm: int) -> str:
    return f"{sm // 10}.{sm % 10}"


def normalize_version(version: str) -> str:
    """A version for comparison: no surrounding blanks, no leading "v", no local build label ("+cu130")."""
    text = str(version).strip()
    if text[:1] in ("v", "V"):
        text = text[1:]
    return text.split("+", 1)[0]


def mismatches(engine: EngineRecord, runtime: RuntimeFacts) -> list[str]:
    """Every known fact on which the engine and the runtime disagree, each naming both values."""
    problems = []
    if runtime.trtllm_version is not None and normalize_version(engine.trtllm_version) != normalize_version(runtime.trtllm_version):
        source = f" ({runtime.trtllm_version_source})" if runtime.trtllm_version_source else ""
        problems.append(f"the engine was built with TensorRT-LLM {engine.trtllm_version}, but this runtime has TensorRT-LLM {runtime.trtllm_version}{source}")
    if engine.compute_capability is not None and runtime.compute_capabilities:
        others = sorted({sm for sm in runtime.compute_capabilities if sm != engine.compute_capability})
        if others:
            built_for = f" ({engine.gpu})" if engine.gpu else ""
            found = ", ".join(format_compute_capability(sm) for sm in others)
            problems.append(
                f"the engine was built for GPU compute capability {format_compute_capability(engine.compute_capability)}{built_for}, "
                f"but this runtime's GPU has compute capability {found}"
            )
    return problems


def check_engine_runtime(engine: EngineRecord, runtime: RuntimeFacts) -> None:
    """Raise EngineRuntimeMismatch naming the recorded and the runtime values of every mismatch."""
    problems = mismatches(engine, runtime)
    if problems:
        raise EngineRuntimeMismatch(
            "; ".join(problems) + ". An engine loads only in the TensorRT-LLM version and on the GPU architecture it was built for: "
            "rebuild it for this runtime, or serve it where it was built for"
        )


# -- probing this machine -------------------------------------------------------------------------
def probe_trtllm_version() -> tuple[str | None, str]:
    """(version, where it came from) of the installed TensorRT-LLM, or (None, "") when there is none."""
    for distribution in _TRTLLM_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(distribution), f"installed {distribution} package"
        except importlib.metadata.PackageNotFoundError:
            continue
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None, ""
    try:  # importable without distribution metadata (a source checkout on sys.path): ask the module
        import tensorrt_llm
    except Exception:  # a broken or GPU-less install: the version stays unknown, the server will say more
        return None, ""
    version = getattr(tensorrt_llm, "__version__", None)
    return (str(version), "tensorrt_llm.__version__") if version else (None, "")


def probe_compute_capabilities(
    gpu_ids: Sequence[int] = (),
    *,
    which: Callable[[str], str | None] = shutil.which,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> tuple[int, ...]:
    """Compute capabilities of the GPUs `nvidia-smi` lists (only `gpu_ids` when given); () when unknown."""
    if which(NVIDIA_SMI_QUERY[0]) is None:
        return ()
    try:
        done = run(list(NVIDIA_SMI_QUERY), capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if done.returncode != 0:  # e.g. a driver too old for the compute_cap field
        return ()
    found: list[int] = []
    for line in done.stdout.splitlines():
        if not line.strip():
            continue
        index, _, capability = line.partition(",")
        try:
            gpu_index, sm = int(index.strip()), parse_compute_capability(capability)
        except ValueError:
            return ()  # an answer we cannot read is no answer
        if not gpu_ids or gpu_index in gpu_ids:
            found.append(sm)
    return tuple(found)


def probe_runtime(
    gpu_ids: Sequence[int] = (),
    *,
    fallback_version: str | None = None,
    fallback_source: str = "",
    which: Callable[[str], str | None] = shutil.which,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> RuntimeFacts:
    """This machine's facts; `fallback_version` (e.g. from an image tag's profile) when no TensorRT-LLM is installed."""
    version, source = probe_trtllm_version()
    if version is None and fallback_version is not None:
        version, source = fallback_version, fallback_source
    return RuntimeFacts(version, source, probe_compute_capabilities(gpu_ids, which=which, run=run))


# -- the container entrypoint ---------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[args.index("--") + 1 :] if "--" in args else []
    options = args[: args.index("--")] if "--" in args else args
    parser = argparse.ArgumentParser(prog="engine_runtime.py", description="check the runtime against the engine, then exec the command")
    parser.add_argument("--trtllm-version", required=True, help="TensorRT-LLM version the engine was built with")
    parser.add_argument("--compute-capability", help="GPU compute capability the engine was built for (e.g. 9.0)")
    parser.add_argument("--gpu", help="name of the GPU the engine was built for")
    parsed = parser.parse_args(options)
    sm = parse_compute_capability(parsed.compute_capability) if parsed.compute_capability else None
    engine = EngineRecord(parsed.trtllm_version, sm, parsed.gpu)
    try:
        check_engine_runtime(engine, probe_runtime())
    except EngineRuntimeMismatch as mismatch:
        print(f"trtllm-pipeline: refusing to start the server: {mismatch}", file=sys.stderr, flush=True)
        return MISMATCH_EXIT_CODE
    if command:
        os.execvp(command[0], command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
