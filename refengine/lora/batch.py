"""Many adapters in one batch: the base Linears run once over every row, then each adapter's low-rank update is added
to its own rows only (S-LoRA's and Punica's idea), never a forward per adapter.

Per layer and site (modules.py), the rows of each adapter are gathered, multiplied by its shrink [in, R] and expand
[R, width] matrices, and added back into the site's outputs (`index_add_`). Two ways, chosen once per step:

- padded: the adapters' rows gathered into [adapters, m, in] (m the largest group, shorter groups padded with a zeroed
  row), and both products as one batched GEMM each over the adapters' stacked matrices (zero-padded to the largest
  rank). A handful of kernels per site whatever the number of adapters: the decode steps' way.
- per adapter: a gather, two GEMMs and a scatter per adapter, when padding would waste more than the rows themselves
  (a long prompt chunk beside single decode tokens).

Rows without an adapter are in no group: the base model's output, untouched. Pad entries gather row 0 with their
product zeroed, so they add exact zeros.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from refengine.lora.adapter import LoraAdapter
from refengine.lora.modules import Site

_PAD_SLACK_ROWS = 64  # padding this many rows is always cheaper than a loop over the adapters


class LoraStacks:
    """The zero-padded stacks [adapters, in, R] / [adapters, R, width] of one batch composition, per (layer, site), built on
    first use and kept while the composition lasts (consecutive decode steps repeat it). Owned by the model runner."""

    def __init__(self) -> None:
        self._adapters: tuple[LoraAdapter, ...] = ()
        self._stacks: dict[tuple[int, Site], tuple[torch.Tensor, torch.Tensor] | None] = {}

    def get(self, adapters: tuple[LoraAdapter, ...], layer: int, site: Site) -> tuple[torch.Tensor, torch.Tensor] | None:
        if len(adapters) != len(self._adapters) or any(a is not b for a, b in zip(adapters, self._adapters)):
            self._adapters, self._stacks = adapters, {}
        key = (layer, site)
        if key not in self._stacks:
            self._stacks[key] = _stack([adapter.sites.get(key) for adapter in adapters])
        return self._stacks[key]


def _stack(weights: list) -> tuple[torch.Tensor, torch.Tensor] | None:
    present = [w for w in weights if w is not None]
    if not present:
        return None
    rank, reference = max(w.rank for w in present), present[0]
    shrink = reference.shrink.new_zeros((len(weights), reference.shrink.shape[0], rank))
    expand = reference.expand.new_zeros((len(weights), rank, reference.expand.shape[1]))
    for index, w in enumerate(weights):
        if w is not None:
            shrink[index, :, : w.rank] = w.shrink
            expand[index, : w.rank] = w.expand
    return shrink, expand


class LoraBatch:
    """Which rows of a step's flat token batch run which adapter."""

    def __init__(self, adapters: tuple[LoraAdapter, ...], row_group: torch.Tensor, stacks: LoraStacks) -> None:
        """`row_group` [tokens]: each row's index into `adapters`, -1 for the base model."""
        self.adapters = adapters
        self._row_group = row_group
        self._stacks = stacks
        counts = torch.bincount(row_group + 1, minlength=len(adapters) + 1).tolist()  # base rows, then each adapter's
        sizes = counts[1:]
        grouped = torch.argsort(row_group, stable=True)[counts[0] :]  # the adapters' rows, adapter by adapter, in order
        self._groups = grouped.split(sizes)
        most, total = max(sizes), sum(sizes)
        self._gather = self._mask = None
        if len(adapters) * most <= max(2 * total, total + _PAD_SLACK_ROWS):
            pads = [most - size for size in sizes]
            if not any(pads):
                self._gather = grouped
            else:
                self._gather = torch.cat([torch.cat((rows, rows.new_zeros(pad))) for rows, pad in zip(self._groups, pads)])
                dtype = next(iter(adapters[0].sites.values())).shrink.dtype
                self._mask = torch.tensor([[1.0] * size + [0.0] * pad for size, pad in zip(sizes, pads)], dtype=dtype).unsqueeze(2)

    @property
    def padded(self) -> bool:
        """Whether the updates run as padded batched GEMMs (else as a loop over the adapters)."""
        return self._gather is not None

    @classmethod
    def of(cls, sequences: Sequence[tuple[LoraAdapter | None, int]], stacks: LoraStacks) -> LoraBatch | None:
        """The batch of sequences given as (adapter or None, their rows this step) in batch order; None without adapters."""
        adapters = tuple(sorted({id(a): a for a, _ in sequences if a is not None}.values(), key=lambda a: a.task_id))
        if not adapters:
            return None
        index = {id(adapter): position for position, adapter in enumerate(adapters)}
        groups = torch.tensor([-1 if adapter is None else index[id(adapter)] for adapter, _ in sequences])
        return cls(adapters, groups.repeat_interleave(torch.tensor([rows for _, rows in sequences])), stacks)

    def select(self, rows: Sequence[int]) -> LoraBatch:
        """The same adapters over the kept `rows` of the batch (the last layer's pruned rows)."""
        return LoraBatch(self.adapters, self._row_group[list(rows)], self._stacks)

    def add(self, layer: int, site: Site, x: torch.Tensor, outputs: tuple[torch.Tensor, ...]) -> None:
        """Add each adapter's update of `site` in `layer` (x its input [rows, in]) to its rows of `outputs`."""
        if self._gather is None:
            for adapter, rows in zip(self.adapters, self._groups):
                weights = adapter.sites.get((layer, site))
                if weights is not None and len(rows):
                    _scatter(outputs, rows, x.index_select(0, rows).mm(weights.shrink).mm(weights.expand))
            return
        stack = self._stacks.get(self.adapters, layer, site)
        if stack is None:
            return
        shrink, expand = stack
        low = torch.bmm(x.index_select(0, self._gather).view(len(self.adapters), -1, x.shape[1]), shrink)
        if self._mask is not None:
            low.mul_(self._mask)
        _scatter(outputs, self._gather, torch.bmm(low, expand).flatten(0, 1))


def _scatter(outputs: tuple[torch.Tensor, ...], rows: torch.Tensor, delta: torch.Tensor) -> None:
    """Add `delta`'s columns, split by the outputs' widths, into `rows` of each output."""
    column = 0
    for output in outputs:
        width = output.shape[1]
        output.index_add_(0, rows, delta if len(outputs) == 1 else delta[:, column : column + width])
        column += width
