"""How the BLS wires client inputs through preprocessing → tensorrt_llm → postprocessing.

The wiring is the ensemble's, read from the BLS's contract.json (rendered with the ensemble from
pipeline/render/contract.py), not a copy. Pure, importable outside Triton.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from model_contract import ModelContract


@dataclass(frozen=True)
class BlsWiring:
    """Tensor name → tensor name, for each hop the BLS makes (the keys of its contract's `wiring`)."""

    client_to_preprocessing: Mapping[str, str]
    preprocessing_to_llm: Mapping[str, str]
    client_to_llm: Mapping[str, str]  # passed straight through, LoRA inputs included (declared on every repository)
    llm_to_client: Mapping[str, str]

    @classmethod
    def from_contract(cls, contract: ModelContract) -> BlsWiring:
        return cls(**{field.name: contract.wiring_map(field.name) for field in fields(cls)})

    @property
    def client_inputs(self) -> tuple[str, ...]:
        """Every client input the BLS reads (absent ones are simply not forwarded)."""
        return (*self.client_to_preprocessing, *self.client_to_llm)


# A request flag → the tensorrt_llm output that answers it (the BLS passes both through).
_FIGURE_OUTPUTS = {
    "return_perf_metrics": "kv_cache_alloc_new_blocks",
    "return_num_input_tokens": "num_input_tokens",
    "return_num_output_tokens": "num_output_tokens",
}


def figures_not_given(llm_inputs, tensors, requested) -> str | None:
    """The first flag the client set, whose output it asked for, that the LLM's response lacks."""
    for flag, output in _FIGURE_OUTPUTS.items():
        asked = flag in llm_inputs and bool(llm_inputs[flag].reshape(-1)[0]) and output in requested
        if asked and output not in tensors:
            return flag
    return None
