"""A loaded adapter: per (layer, site) one shrink and one expand matrix in the compute dtype.

The modules of a site are stacked along the rank: `shrink` [in, R] holds each module's Aᵀ side by side, `expand`
[R, site width] each module's Bᵀ in its rows, placed in the site's output columns (zeros elsewhere). Then
x · shrink · expand is the sum of the site's modules' updates, each x Aᵀ Bᵀ in its own columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import torch

from refengine.lora.modules import ModelLoraShape, ModuleTarget, Site
from refengine.lora.request import ParsedAdapter


@dataclass(frozen=True)
class SiteWeights:
    shrink: torch.Tensor  # [in, R]
    expand: torch.Tensor  # [R, site width]

    @property
    def rank(self) -> int:
        return self.shrink.shape[1]


@dataclass(frozen=True, eq=False)
class LoraAdapter:
    task_id: int
    digest: bytes
    nbytes: int
    rank: int  # the largest rank of its rows
    sites: MappingProxyType  # (layer, Site) -> SiteWeights

    @property
    def prefix_salt(self) -> bytes:
        """Mixed into the prefix-cache hashes of its requests: K/V computed under it serve only it."""
        return b"lora:" + self.digest


def build_adapter(
    task_id: int, parsed: ParsedAdapter, targets: dict[int, ModuleTarget], shape: ModelLoraShape, dtype: torch.dtype
) -> LoraAdapter:
    widths = shape.site_widths()
    grouped: dict[tuple[int, Site], list] = {}
    for row in parsed.rows:
        grouped.setdefault((row.layer, targets[row.module_id].site), []).append(row)
    sites = {}
    for (layer, site), rows in grouped.items():
        total_rank = sum(row.rank for row in rows)
        expand = torch.zeros((total_rank, sum(widths[site])), dtype=dtype)
        start = 0
        for row in rows:
            b_t = row.b.t().to(dtype)
            for first_row, first_column, count in targets[row.module_id].placements:
                expand[start : start + row.rank, first_column : first_column + count] = b_t[:, first_row : first_row + count]
            start += row.rank
        shrink = torch.cat([row.a.to(dtype) for row in rows]).t().contiguous()
        sites[(layer, site)] = SiteWeights(shrink, expand)
    return LoraAdapter(task_id, parsed.digest, parsed.nbytes, max(row.rank for row in parsed.rows), MappingProxyType(sites))
