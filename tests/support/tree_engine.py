"""The engine directory a tree-speculation engine (Medusa, EAGLE-1/2) would have on a GPU host, reduced to its
config.json (what packaging reads), and the Triton repository rendered for it: packaging is checked without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.backends.engine.trtllm_build import TrtllmBuild


def render_for_engine(build: TrtllmBuild, loaded, directory: Path, *, architecture: str, max_draft_len: int, **pretrained):
    """Write `directory/engine/config.json` (the planned build's, with the given architecture, max_draft_len and other
    pretrained_config keys),
    render the repository into `directory/repository`, and return its parsed tensorrt_llm config."""
    from pipeline.render import RepositoryRequest, render_model_repository
    from pipeline.render.pbtxt import parse_config

    engine = directory / "engine"
    engine.mkdir(parents=True)
    build_config = {**build.engine_build_config, "max_draft_len": max_draft_len}
    (engine / "config.json").write_text(
        json.dumps(
            {
                "version": "1.2.1",
                "pretrained_config": {
                    "architecture": architecture,
                    "dtype": "float16",
                    "logits_dtype": "float32",
                    "vocab_size": 4096,
                    "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
                    "quantization": build.quantization,
                    **pretrained,
                },
                "build_config": build_config,
            }
        )
    )
    render_model_repository(
        RepositoryRequest(
            engine_dir=engine,
            out_dir=directory / "repository",
            tokenizer_dir=directory / "no-tokenizer",
            serve=loaded.spec.serve,
            target="engine",
            dry_run=True,
            speculative=loaded.spec.build.speculative,
            gpu_device_ids=(0,),
        )
    )
    return parse_config((directory / "repository" / "tensorrt_llm" / "config.pbtxt").read_text(), "tensorrt_llm")
