"""Helpers of the converter tests: tiny models quantized with ModelOpt and exported as unified checkpoints, cached
per test module, and converted with the family's checkpoint config."""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch


@contextlib.contextmanager
def cached_exports(root: Path, export: Callable[[str, str, Path], Path]) -> Iterator[Callable[[str, str], Path]]:
    """`get(family, algo)` -> `export(family, algo, directory)`'s directory, made once; torch on one thread meanwhile."""
    made: dict[tuple[str, str], Path] = {}

    def get(family: str, algo: str) -> Path:
        if (family, algo) not in made:
            made[family, algo] = export(family, algo, root / f"{family}-{algo}")
        return made[family, algo]

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield get
    finally:
        torch.set_num_threads(previous)


def quantize_and_export(model: torch.nn.Module, algo: str, vocab: int, directory: Path) -> Path:
    """FP8 (+ FP8 KV) calibration on two random batches when `algo` is fp8, then the unified export (fp16)."""
    import modelopt.torch.quantization as mtq

    from pipeline.quantization.modelopt_export import QuantRecipe, _mtq_config
    from pipeline.quantization.unified_export import export_unified_checkpoint

    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, vocab, (2, 32), generator=generator) for _ in range(2)]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        if algo == "fp8":
            model = mtq.quantize(model, _mtq_config(QuantRecipe("fp8", "fp8")), lambda m: [m(b) for b in batches])
        export_unified_checkpoint(model, directory, dtype=torch.float16)
    return directory


def convert(unified: Path, out: Path, tp: int, pp: int = 1) -> dict:
    """The unified checkpoint converted with the family's pretrained_config (quantization from hf_quant_config.json)."""
    from pipeline.quantization.trtllm_checkpoint.convert import convert_unified_checkpoint
    from pipeline.quantization.trtllm_checkpoint.pretrained import pretrained_config

    hf = json.loads((unified / "config.json").read_text())
    mapping = {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}
    config = pretrained_config(hf, dtype="float16", mapping=mapping, quantization={})
    return convert_unified_checkpoint(unified, out, config=config, tp_size=tp, pp_size=pp)
