"""What the repository renderer takes: one frozen request instead of a parameter per feature."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.config.spec import ServeSpec, SpeculativeSpec, Target

if TYPE_CHECKING:
    from pipeline.render.repository import ConfigPaths


@dataclass(frozen=True)
class RepositoryRequest:
    """The Triton model repository of `engine_dir` (and its tokenizer) for `serve` on `target`, written into `out_dir`.

    `dry_run` (of the engine target: no weights, so no rank*.engine, and possibly no tokenizer): the rank-file check
    is skipped, and without tokenizer.json so are the tokenizer checks; the configs still name `engine_dir` and
    `tokenizer_dir`, which must be complete before the server starts. `speculative` is the spec's build.speculative:
    the engine's speculative mode is read from its config, the runtime's lookahead (W, N, G) from here.
    `draft_engine_dir` is the draft stage's engine of draft_tokens_external (the engine target serves it as
    tensorrt_llm_draft, named `draft_config_dir` in its config); a cpu engine carries its draft inside
    (<engine>/draft). `final_out_dir`: where `out_dir` will be once the stage succeeds (the absolute paths of files
    inside the repository name it). `python_instances`: the instance counts of preprocessing, postprocessing and the
    BLS the package stage planned (pipeline.capacity.for_spec); a count the spec sets wins, and 1 stands in where
    neither gives one. The target is a `Target` from construction on (a string naming one is converted once)."""

    engine_dir: Path
    tokenizer_dir: Path
    serve: ServeSpec
    target: Target
    out_dir: Path
    gpu_device_ids: Sequence[int] = ()
    config_paths: ConfigPaths | None = None
    dry_run: bool = False
    speculative: SpeculativeSpec | None = None
    draft_engine_dir: Path | None = None
    draft_config_dir: str | None = None
    final_out_dir: Path | None = None
    python_instances: Mapping[str, int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "target", Target(self.target))
