"""What the bench commands share: the status console (stderr, so stdout carries only the result)
and building, from the command's arguments, what a benchmark measures."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from pipeline.artifacts import ArtifactStore
    from pipeline.config.loader import LoadedConfig

# cli.py's `_build_cpu_target(loaded, store, command, until)`: refuse a non-cpu target, then build up to `until`
BuildCpuTarget = Callable[["LoadedConfig", "ArtifactStore", str, str], dict[str, Any]]


def status_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def dim_lines(console: Console) -> Callable[[str], None]:
    """A progress callback printing each line dimmed."""
    return lambda line: console.print(f"[dim]{line}[/dim]")


def build_for_bench(args: argparse.Namespace, build_cpu_target: BuildCpuTarget, command: str, until: str) -> tuple[LoadedConfig, ArtifactStore, dict[str, Any]]:
    """The config of `args` loaded, its artifact store, and the stage results up to `until`."""
    from pipeline.artifacts import ArtifactStore, store_root
    from pipeline.config.loader import load_config

    loaded = load_config(args.config, args.overrides)
    store = ArtifactStore(store_root(args.artifacts, writable=True), loaded.spec.name)
    return loaded, store, build_cpu_target(loaded, store, command, until)


def write_and_print(result: dict[str, Any], out: Path, as_json: bool, render: Callable[[dict[str, Any]], str], status: Console) -> None:
    """Write the JSON result to `out`; print it as JSON (`as_json`) or rendered, naming the file on stderr."""
    import json

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    if as_json:
        print(json.dumps(result, indent=1, sort_keys=True))
    else:
        print(render(result))
        status.print(f"wrote {out}")
