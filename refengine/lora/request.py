"""A request's LoRA inputs, as NVIDIA's contract names them, and their checks against the model.

`lora_weights` / `lora_config` are the tensors of TensorRT-LLM's `examples/hf_lora_convert.py` (written as
`model.lora_weights.npy` / `model.lora_config.npy`, with a leading batch axis of 1): one row per (module, layer),
`lora_config` rows [module_id, layer, rank] (TensorRT-LLM ≥ 0.16 also reads a 4th column, is_dora), `lora_weights`
rows A [rank, in] then B [out, rank] flattened, zero-padded to the longest row (refengine/lora/modules.py).

The checks are TensorRT-LLM's `runtime/loraUtils.cpp` `loraValidateRequestTensors` (both tensors or neither, a batch
axis of 1, equal row counts, 3 or 4 config columns, layer in [0, layers), rank > 0 and <= the largest adapter size,
the module enabled for the model, enough values in the row), plus: integer config and floating-point weights, every
value finite, one row per (module, layer). Each refusal is an `InvalidRequestError` naming the input.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch

from refengine.errors import InvalidRequestError
from refengine.lora.modules import ModuleTarget, module_name

TASK_ID, WEIGHTS, CONFIG = "lora_task_id", "lora_weights", "lora_config"
MAX_TASK_ID = 2**64 - 1  # the contract's UINT64
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True, eq=False)
class LoraRequest:
    """The LoRA inputs of one request: `task_id` alone asks for a cached adapter (sent with an earlier request or
    prefetched); with `weights` and `config` the adapter is loaded under `task_id` and kept for later requests.
    `weights` [1, rows, values] (the contract's batch axis) or [rows, values], floating point; `config` [1, rows, 3 or 4]
    or [rows, 3 or 4], integers; numpy arrays or torch tensors."""

    task_id: int | None
    weights: Any = None
    config: Any = None


@dataclass(frozen=True)
class LoraRow:
    module_id: int
    layer: int
    rank: int
    a: torch.Tensor  # [rank, in], as sent
    b: torch.Tensor  # [out, rank], as sent


@dataclass(frozen=True)
class ParsedAdapter:
    rows: tuple[LoraRow, ...]
    digest: bytes  # of the rows' values: equal digests, equal adapters
    nbytes: int  # rank × (in + out) values per row, at the sent element size (what TensorRT-LLM's cache holds)


def check_task_id(request: LoraRequest) -> int:
    """The task id; a request with weights or config needs one ("lora_task_id must be set for LoRA inference")."""
    task_id = request.task_id
    if task_id is None:
        raise InvalidRequestError(TASK_ID, "lora_task_id must be set for LoRA inference (lora_weights / lora_config came without it)")
    if isinstance(task_id, bool) or not isinstance(task_id, int) or not 0 <= task_id <= MAX_TASK_ID:
        raise InvalidRequestError(TASK_ID, f"must be an unsigned 64-bit integer, got {task_id!r}")
    if (request.weights is None) != (request.config is None):
        missing, given = (WEIGHTS, CONFIG) if request.weights is None else (CONFIG, WEIGHTS)
        raise InvalidRequestError(
            missing,
            f"is missing: {given} came without it, and a request for LoRA inference must have both "
            "lora_weights and lora_config, or neither (the task id of a cached adapter alone)",
        )
    return task_id


def parse_adapter(request: LoraRequest, targets: dict[int, ModuleTarget], num_layers: int, max_rank: int) -> ParsedAdapter:
    """The rows of `request`'s weights and config, checked against the model's `targets` (module id -> target)."""
    weights = _matrix(request.weights, WEIGHTS, "values")
    config = _matrix(request.config, CONFIG, "columns")
    if weights.dtype not in _FLOAT_DTYPES:
        raise InvalidRequestError(WEIGHTS, f"must hold floating-point values (the contract's FP16), got {weights.dtype}")
    if config.dtype.is_floating_point or config.dtype.is_complex or config.dtype == torch.bool:
        raise InvalidRequestError(CONFIG, f"must hold integers (the contract's INT32), got {config.dtype}")
    if config.shape[1] not in (3, 4):
        raise InvalidRequestError(CONFIG, f"has {config.shape[1]} columns; its rows are [module_id, layer, rank] (or with is_dora, 4)")
    if weights.shape[0] != config.shape[0]:
        raise InvalidRequestError(WEIGHTS, f"has {weights.shape[0]} rows and lora_config {config.shape[0]}: one weights row per config row")
    if weights.shape[0] == 0:
        raise InvalidRequestError(CONFIG, "has no rows: an adapter needs at least one (module, layer) row")
    finite = torch.isfinite(weights).all(dim=1)
    if not bool(finite.all()):
        raise InvalidRequestError(WEIGHTS, f"row {int((~finite).nonzero()[0])} holds NaN or infinite values")
    rows, seen, digest, nbytes = [], set(), hashlib.blake2b(digest_size=16), 0
    for index, (module_id, layer, rank, *dora) in enumerate(config.tolist()):
        where = f"row {index} ({module_name(module_id)}, layer {layer}, rank {rank})"
        target = _check_row(where, module_id, layer, rank, dora, targets, num_layers, max_rank)
        needed = rank * (target.in_features + target.out_features)
        if weights.shape[1] < needed:
            raise InvalidRequestError(
                WEIGHTS,
                f"{where}: needs rank × (in + out) = {rank} × ({target.in_features} + "
                f"{target.out_features}) = {needed} values, the rows have {weights.shape[1]}",
            )
        if (module_id, layer) in seen:
            raise InvalidRequestError(CONFIG, f"{where}: a second row for {module_name(module_id)} of layer {layer}")
        seen.add((module_id, layer))
        values = weights[index, :needed]
        split = rank * target.in_features
        rows.append(LoraRow(module_id, layer, rank, values[:split].reshape(rank, target.in_features), values[split:].reshape(target.out_features, rank)))
        digest.update(f"{module_id},{layer},{rank};".encode())
        digest.update(values.contiguous().view(torch.uint8).numpy().tobytes())
        nbytes += needed * weights.element_size()
    return ParsedAdapter(tuple(rows), digest.digest(), nbytes)


def _check_row(
    where: str, module_id: int, layer: int, rank: int, dora: list[int], targets: dict[int, ModuleTarget], num_layers: int, max_rank: int
) -> ModuleTarget:
    if dora and dora[0]:
        raise InvalidRequestError(CONFIG, f"{where}: is_dora is set; DoRA adapters are not run by this engine")
    target = targets.get(module_id)
    if target is None:
        enabled = ", ".join(f"{module_name(i)} ({i})" for i in sorted(targets)) or "none"
        raise InvalidRequestError(CONFIG, f"{where}: lora module {module_name(module_id)} not enabled for this model (enabled: {enabled})")
    if not 0 <= layer < num_layers:
        raise InvalidRequestError(CONFIG, f"{where}: layer {layer} is outside the model's layers [0, {num_layers})")
    if rank <= 0:
        raise InvalidRequestError(CONFIG, f"{where}: the rank (adapter size) must be > 0")
    if rank > max_rank:
        raise InvalidRequestError(
            CONFIG, f"{where}: rank {rank} exceeds the largest adapter size {max_rank} (lora_cache_max_adapter_size, at most the build's max_lora_rank)"
        )
    return target


def _matrix(value: Any, field: str, second_axis: str) -> torch.Tensor:
    """`value` as a 2-D tensor: [rows, values] or [1, rows, values] (the contract's batch axis of 1)."""
    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise InvalidRequestError(field, f"must be a numeric array, got {type(value).__name__}") from None
    if tensor.dim() == 3:
        if tensor.shape[0] != 1:
            raise InvalidRequestError(field, f"has shape {list(tensor.shape)}: its first axis is one request's batch of 1")
        tensor = tensor[0]
    if tensor.dim() != 2:
        raise InvalidRequestError(field, f"has shape {list(tensor.shape)}; expected [1, rows, {second_axis}] or [rows, {second_axis}]")
    return tensor
