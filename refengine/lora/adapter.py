"""A loaded adapter: per (layer, site) its modules' Aᵀ and Bᵀ.

A module's update of its site's input x is x · shrink · expand (shrink = Aᵀ [in, rank], expand = Bᵀ [rank, out]),
whose columns land in the site's outputs as the module's placements say (modules.py).

Weights sent as float16 / bfloat16 (NVIDIA's lora_weights are FP16) are kept so when the compute dtype is float32 and
widened right before their GEMMs (batch.py), as the model's own fp16 weights are (model_runner/linear.py
`weight_storage`): every value widens exactly, and each step reads half the bytes, which on a small model is most of
what many adapters cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import torch

from refengine.lora.modules import ModuleTarget, Site
from refengine.lora.request import ParsedAdapter


@dataclass(frozen=True)
class ModuleWeights:
    module_id: int
    shrink: torch.Tensor  # Aᵀ [in, rank]
    expand: torch.Tensor  # Bᵀ [rank, out]
    placements: tuple[tuple[int, int, int], ...]  # (first expand column, first site column, count)

    @property
    def rank(self) -> int:
        return self.shrink.shape[1]


@dataclass(frozen=True, eq=False)
class LoraAdapter:
    task_id: int
    digest: bytes
    nbytes: int
    rank: int  # the largest rank of its rows
    sites: MappingProxyType[tuple[int, Site], tuple[ModuleWeights, ...]]  # (layer, Site) -> its modules' weights, by module id

    @property
    def prefix_salt(self) -> bytes:
        """Mixed into the prefix-cache hashes of its requests: K/V computed under it serve only it."""
        return b"lora:" + self.digest


def build_adapter(task_id: int, parsed: ParsedAdapter, targets: dict[int, ModuleTarget], dtype: torch.dtype) -> LoraAdapter:
    """`dtype`: the compute dtype."""
    sites: dict[tuple[int, Site], list[ModuleWeights]] = {}
    for row in sorted(parsed.rows, key=lambda row: (row.layer, row.module_id)):
        target = targets[row.module_id]
        kept = row.a.dtype if dtype == torch.float32 and row.a.dtype in (torch.float16, torch.bfloat16) else dtype
        weights = ModuleWeights(row.module_id, row.a.t().to(kept).contiguous(), row.b.t().to(kept).contiguous(), target.placements)
        sites.setdefault((row.layer, target.site), []).append(weights)
    return LoraAdapter(
        task_id, parsed.digest, parsed.nbytes, max(row.rank for row in parsed.rows), MappingProxyType({key: tuple(modules) for key, modules in sites.items()})
    )
