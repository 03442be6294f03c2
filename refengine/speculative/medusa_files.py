"""Writing Medusa files: a heads directory (random heads, for tests and cost measurements) and a CPU engine directory
marked for Medusa, as the pipeline's cpu build writes it (settings.py reads it).

A heads directory holds `medusa_lm_head.safetensors` (medusa_heads.py) and a `config.json`:
`{"medusa_num_heads": K, "medusa_num_layers": L, "hidden_size": H, "vocab_size": V, "medusa_hidden_act": "silu",
"base_model_name_or_path": ..., "medusa_choices": [[0], ...]}` (`medusa_choices`, optional, the tree recommended for the heads).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from refengine.errors import EngineConfigError
from refengine.speculative.medusa_heads import HEADS_FILE
from refengine.speculative.medusa_tree import as_choices, check_medusa_choices
from refengine.speculative.settings import MODE_MEDUSA, SPECULATIVE_KEY

HEADS_SUBDIR = "medusa"


def write_random_medusa_heads(
    directory: Path,
    num_heads: int,
    num_layers: int,
    hidden_size: int,
    vocab_size: int,
    seed: int = 0,
    medusa_choices: Sequence[Sequence[int]] | None = None,
    base_model: str = "base",
    scale: float = 0.05,
) -> Path:
    """Random float16 heads in the Medusa layout (what untrained heads would propose: greedy output must not change)."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return (scale * torch.randn(shape, generator=generator)).half()

    tensors = {}
    for head in range(num_heads):
        for layer in range(num_layers):
            tensors[f"{head}.{layer}.linear.weight"] = normal(hidden_size, hidden_size)
            tensors[f"{head}.{layer}.linear.bias"] = normal(hidden_size)
        tensors[f"{head}.{num_layers}.weight"] = normal(vocab_size, hidden_size) * 20
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / HEADS_FILE))
    config: dict[str, Any] = {
        "medusa_num_heads": num_heads,
        "medusa_num_layers": num_layers,
        "hidden_size": hidden_size,
        "vocab_size": vocab_size,
        "medusa_hidden_act": "silu",
        "base_model_name_or_path": base_model,
    }
    if medusa_choices is not None:
        config["medusa_choices"] = [list(path) for path in medusa_choices]
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def write_medusa_engine(
    engine_dir: Path,
    heads_dir: Path,
    medusa_choices: Sequence[Sequence[int]] | None = None,
    max_draft_len: int | None = None,
    medusa_vocab_size: int | None = None,
) -> None:
    """Mark a CPU engine directory as a Medusa engine: the heads copied to `<engine_dir>/medusa/`, the
    `refengine_speculative` section and TensorRT-LLM's build_config fields (speculative_decoding_mode 4, max_draft_len:
    the tree's node count unless given). `medusa_choices` None: the heads' recommended tree (their config.json);
    `medusa_vocab_size` M: the heads propose only the first M token ids."""
    heads_config = json.loads((heads_dir / "config.json").read_text())
    num_heads, num_layers = heads_config["medusa_num_heads"], heads_config["medusa_num_layers"]
    raw = medusa_choices if medusa_choices is not None else heads_config.get("medusa_choices")
    if raw is None:
        raise EngineConfigError("medusa_choices", f"none given and {heads_dir / 'config.json'} recommends none")
    try:
        paths = as_choices(raw)
        choices = check_medusa_choices(paths, num_heads, max_draft_len or len(paths), "medusa_choices")
    except ValueError as error:
        raise EngineConfigError("medusa_choices", str(error).removeprefix("medusa_choices: ")) from None
    target = engine_dir / HEADS_SUBDIR
    target.mkdir(exist_ok=True)
    for name in (HEADS_FILE, "config.json"):
        shutil.copyfile(heads_dir / name, target / name)
    path = engine_dir / "config.json"
    config = json.loads(path.read_text())
    draft_len = max_draft_len or len(choices)
    config["build_config"]["max_draft_len"] = draft_len
    config["build_config"]["speculative_decoding_mode"] = MODE_MEDUSA
    config[SPECULATIVE_KEY] = {
        "kind": "medusa",
        "max_draft_len": draft_len,
        "medusa_heads": f"{HEADS_SUBDIR}/{HEADS_FILE}",
        "num_medusa_heads": num_heads,
        "num_medusa_layers": num_layers,
        "medusa_choices": [list(p) for p in choices],
    }
    if medusa_vocab_size is not None:
        config[SPECULATIVE_KEY]["medusa_vocab_size"] = medusa_vocab_size
    path.write_text(json.dumps(config, indent=2) + "\n")
