"""The cpu `tensorrt_llm` model's Medusa parameters, read as TensorRT-LLM's backend reads them.

- `medusa_choices`: the tree every request verifies, in NVIDIA's string syntax (`"{0}, {0, 0}, {1}"`); empty or
  absent: the engine's own tree (the build's). refengine checks it against the heads when the model loads
  (`LLMEngine.from_engine_dir`), so a malformed tree, one deeper than the heads or with more nodes than the engine's
  max_draft_len fails the load with a message naming `medusa_choices`.
- `decoding_mode`: TensorRT-LLM overwrites it, with a warning, when it disagrees with the engine (executor's
  decoding-mode checks: "Model is Medusa, but decoding mode is not Medusa. Overwriting decoding mode to Medusa." and the
  reverse); the cpu model does the same: a Medusa engine always decodes with its heads, another never does.

Pure (no Triton), so it is testable outside the server.
"""

from __future__ import annotations

MEDUSA = "medusa"


def medusa_choices(raw: str) -> str | None:
    """The `medusa_choices` parameter's value for `LLMEngine.from_engine_dir` (None: the engine's tree)."""
    return raw.strip() or None


def decoding_mode_warning(decoding_mode: str, medusa_engine: bool) -> str | None:
    """What TensorRT-LLM warns when the `decoding_mode` parameter (empty: unset) disagrees with the engine, else None."""
    mode = decoding_mode.strip().lower()
    if medusa_engine and mode and mode != MEDUSA:
        return f"decoding_mode {decoding_mode!r}: the engine is a Medusa engine; decoding with medusa (as TensorRT-LLM overwrites it)"
    if not medusa_engine and mode == MEDUSA:
        return (
            "decoding_mode 'medusa': the engine was not built for Medusa (build.speculative.mode: medusa); decoding without it (as TensorRT-LLM overwrites it)"
        )
    return None
