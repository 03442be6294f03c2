"""Many adapters in one batch: the base Linears run once over every row, then each adapter's low-rank update is added
to its own rows only (S-LoRA's and Punica's idea), never a forward per adapter.

Per layer and site (modules.py), the rows of each adapter are gathered, multiplied by its Aᵀ, then by each module's
Bᵀ, and added back into the module's output columns (`index_add_`). Two ways, chosen once per step:

- padded: the adapters' rows gathered into [adapters, m, in] (m the largest group, shorter groups padded with a zeroed
  row); one batched GEMM by the site's stacked Aᵀ of every adapter (each module zero-padded to its largest rank in
  the batch), one per module by its stacked Bᵀ. A handful of kernels per site whatever the number of adapters: the
  decode steps' way. The model runner puts each adapter's sequences together (runner.py `by_adapter`), so when the
  groups are of one size their rows are one block of the batch: no gather, and the products are added into it.
- per adapter: a gather, the GEMMs and a scatter per adapter, when padding would waste more than the rows themselves
  (a long prompt chunk beside single decode tokens).

Rows without an adapter are in no group: the base model's output, untouched. Pad entries gather row 0 with their
product zeroed, so they add exact zeros.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from refengine.lora.adapter import LoraAdapter, ModuleWeights
from refengine.lora.modules import Site

_PAD_SLACK_ROWS = 64  # padding this many rows is always cheaper than a loop over the adapters


@dataclass(frozen=True)
class _Slot:
    """One module of a site in a padded batch: its columns of the stacked shrink, its stacked expand [adapters, R, out]."""

    start: int
    end: int
    expand: torch.Tensor
    placements: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class _SiteStack:
    shrink: torch.Tensor  # [adapters, in, Σ R]
    slots: tuple[_Slot, ...]


class LoraStacks:
    """The zero-padded stacks of one batch composition, per (layer, site), built on first use and kept while the
    composition lasts (consecutive decode steps repeat it). Owned by the model runner."""

    def __init__(self) -> None:
        self._adapters: tuple[LoraAdapter, ...] = ()
        self._stacks: dict[tuple[int, Site], _SiteStack | None] = {}
        self._buffers: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}

    def widened(self, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`tensor` in `dtype`: itself, or (fp16 / bf16 weights, float32 compute) copied into this owner's buffer of its
        shape, to be used at once (the next call for the same shape overwrites it)."""
        if tensor.dtype == dtype:
            return tensor
        key = (tuple(tensor.shape), dtype)
        if key not in self._buffers:
            with torch.inference_mode(False):  # a normal tensor: writable inside and outside inference mode
                self._buffers[key] = torch.empty(tensor.shape, dtype=dtype)
        return self._buffers[key].copy_(tensor)

    def get(self, adapters: tuple[LoraAdapter, ...], layer: int, site: Site) -> _SiteStack | None:
        if len(adapters) != len(self._adapters) or any(a is not b for a, b in zip(adapters, self._adapters)):
            self._adapters, self._stacks = adapters, {}
        key = (layer, site)
        if key not in self._stacks:
            self._stacks[key] = _stack([{m.module_id: m for m in adapter.sites.get(key, ())} for adapter in adapters])
        return self._stacks[key]


def _stack(modules: list[dict[int, ModuleWeights]]) -> _SiteStack | None:
    """Each module present in some adapter: Aᵀ and Bᵀ of every adapter, zeros where it has none or a lower rank."""
    shrinks, slots, start = [], [], 0
    for module_id in sorted({module_id for present in modules for module_id in present}):
        weights = [present.get(module_id) for present in modules]
        reference = next(w for w in weights if w is not None)
        rank = max(w.rank for w in weights if w is not None)
        shrink = reference.shrink.new_zeros((len(weights), reference.shrink.shape[0], rank))
        expand = reference.expand.new_zeros((len(weights), rank, reference.expand.shape[1]))
        for index, w in enumerate(weights):
            if w is not None:
                shrink[index, :, : w.rank] = w.shrink
                expand[index, : w.rank] = w.expand
        shrinks.append(shrink)
        slots.append(_Slot(start, start + rank, expand, reference.placements))
        start += rank
    return _SiteStack(torch.cat(shrinks, dim=2), tuple(slots)) if slots else None


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
        self._groups = torch.split(grouped, sizes)  # Tensor.split has no annotations; torch.split calls it
        most, total = max(sizes), sum(sizes)
        self._gather = self._mask = self._block = None
        if len(adapters) * most <= max(2 * total, total + _PAD_SLACK_ROWS):
            pads = [most - size for size in sizes]
            if not any(pads):
                self._gather = grouped
                if bool((row_group[1:] >= row_group[:-1]).all()):  # adapter by adapter: one block after the base rows
                    self._block = (counts[0], counts[0] + total)
            else:
                self._gather = torch.cat([torch.cat((rows, rows.new_zeros(pad))) for rows, pad in zip(self._groups, pads)])
                self._mask = torch.tensor([[1.0] * size + [0.0] * pad for size, pad in zip(sizes, pads)]).unsqueeze(2)

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
        """Add each adapter's update of `site` in `layer` (x its input [rows, in]) to its rows of `outputs` (the site's
        output Linears, whose columns in order are the site's)."""
        if self._gather is None:
            for adapter, rows in zip(self.adapters, self._groups):
                modules = adapter.sites.get((layer, site), ())
                if modules and len(rows):
                    gathered = x.index_select(0, rows)
                    for module in modules:
                        low = gathered.mm(self._stacks.widened(module.shrink, x.dtype))
                        _scatter(outputs, rows, low.mm(self._stacks.widened(module.expand, x.dtype)), module.placements)
            return
        stack = self._stacks.get(self.adapters, layer, site)
        if stack is None:
            return
        widened = self._stacks.widened
        if self._block is not None:
            start, end = self._block
            low = torch.bmm(x[start:end].view(len(self.adapters), -1, x.shape[1]), widened(stack.shrink, x.dtype))
            for slot in stack.slots:
                expand = widened(slot.expand, x.dtype)
                for first, column, count in slot.placements:
                    output, column = _output_at(outputs, column)
                    block = output[start:end, column : column + count].view(len(self.adapters), -1, count)
                    block.baddbmm_(low[:, :, slot.start : slot.end], expand[:, :, first : first + count])
            return
        low = torch.bmm(x.index_select(0, self._gather).view(len(self.adapters), -1, x.shape[1]), widened(stack.shrink, x.dtype))
        if self._mask is not None:
            low.mul_(self._mask.to(x.dtype))
        for slot in stack.slots:
            delta = torch.bmm(low[:, :, slot.start : slot.end], widened(slot.expand, x.dtype)).flatten(0, 1)
            _scatter(outputs, self._gather, delta, slot.placements)


def _output_at(outputs: tuple[torch.Tensor, ...], column: int) -> tuple[torch.Tensor, int]:
    """The output holding site column `column`, and the column within it."""
    for output in outputs[:-1]:
        if column < output.shape[1]:
            return output, column
        column -= output.shape[1]
    return outputs[-1], column


def _scatter(outputs: tuple[torch.Tensor, ...], rows: torch.Tensor, delta: torch.Tensor, placements: tuple[tuple[int, int, int], ...]) -> None:
    """Add `delta`'s columns into `rows` of the outputs' columns the placements name (site columns: the outputs' in order)."""
    for first, column, count in placements:
        output, column = _output_at(outputs, column)
        whole = column == 0 and count == output.shape[1]
        target = output if whole else output[:, column : column + count]
        target.index_add_(0, rows, delta if first == 0 and count == delta.shape[1] else delta[:, first : first + count])
