"""The tensor contract as the Python models read it: `<model>/1/contract.json`, next to their code.

Rendered from `contract.py`, the one source (it renders config.pbtxt too), with the engine's data
types resolved; the models load it at initialize (model_repo/python/model_contract.py) instead of
carrying a copy. Written for the models whose code reads a table of tensor names: the cpu
`tensorrt_llm` (every input it accepts) and `tensorrt_llm_bls` (its client tensors and how it wires
the models it calls). preprocessing and postprocessing read each of their tensors by name in the
line of code that handles it, so they have no table to load.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pipeline.render import contract
from pipeline.render.contract import TensorSpec

CONTRACT_FILE = "contract.json"


def llm_contract(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> str:
    """contract.json of the cpu `tensorrt_llm` model (its config's resolved inputs and outputs)."""
    return _text({"inputs": _entries(inputs), "outputs": _entries(outputs)})


def bls_contract(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], priority: bool = False) -> str:
    """contract.json of `tensorrt_llm_bls`: the ensemble's client tensors and the ensemble's wiring."""
    return _text({"inputs": _entries(inputs), "outputs": _entries(outputs), "wiring": bls_wiring(priority)})


def bls_wiring(priority: bool = False) -> dict[str, dict[str, str]]:
    """The ensemble's steps as the BLS runs them; the LoRA inputs are declared on every repository, the priority where the
    LLM model takes one."""
    return {
        "client_to_preprocessing": dict(contract.CLIENT_TO_PREPROCESSING),
        "preprocessing_to_llm": dict(contract.PREPROCESSING_TO_LLM),
        "client_to_llm": {**contract.CLIENT_TO_LLM, **contract.LORA_CLIENT_TO_LLM, **(contract.PRIORITY_CLIENT_TO_LLM if priority else {})},
        "llm_to_client": dict(contract.LLM_TO_CLIENT),
    }


def _entries(specs: Sequence[TensorSpec]) -> list[dict[str, Any]]:
    return [{"name": s.name, "data_type": s.data_type, "dims": list(s.dims), "optional": s.optional} for s in specs]


def _text(document: dict[str, Any]) -> str:
    """JSON with one line per tensor (readable and diffable in the golden files)."""
    sections = []
    for key, value in document.items():
        if isinstance(value, list):
            rows = ",\n".join(f"    {json.dumps(item)}" for item in value)
            sections.append(f"  {json.dumps(key)}: [\n{rows}\n  ]" if value else f"  {json.dumps(key)}: []")
        else:
            sections.append(f"  {json.dumps(key)}: " + json.dumps(value, indent=2).replace("\n", "\n  "))
    return "{\n" + ",\n".join(sections) + "\n}\n"
