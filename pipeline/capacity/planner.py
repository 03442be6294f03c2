"""Capacity planning for the engine target: do the weights fit, how many tokens does the KV cache hold.

The formulas are the usual roofline and KV-capacity arithmetic; the assumptions are the project's:
- parameters per Llama layer = h·heads·hd + 2·h·kvh·hd + heads·hd·h + 3·h·ffn + 2·h; embedding and
  lm_head = vocab × h each and stay 16-bit (ModelOpt's default excludes lm_head), so only the
  decoder layers take the quantized format's bytes per parameter;
- KV bytes per token = 2 (K, V) × layers × kv_heads × head_dim × bytes of the KV dtype;
- KV space = kv_cache_free_gpu_mem_fraction × (GPU memory − weights − runtime/activation reserve),
  with a 5 GB reserve; tokens = KV space / KV bytes per token; block rounding wastes at most one
  partial block per sequence;
- B = 1 decode bound = memory bandwidth / bytes read per step (all weights except the embedding).
With tensor parallelism each GPU holds 1/tp of the weights and of the KV heads (KV heads are
replicated when tp exceeds them). GB are decimal (10^9 bytes), as datasheets give them. GPU figures: NVIDIA's
datasheets (H200: 141 GB HBM3e, 4.8 TB/s, FP8 3,958 / BF16 1,979 TFLOPS with 2:4 sparsity, so half dense; H100:
80 GB, 3.35 TB/s) and the memory torch reports on a card (`total_memory`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.capacity.model_size import (
    ParamCount,
    count_params,
    kv_bytes_per_layer_token,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    weight_bytes_per_param,
)
from pipeline.config.gpus import RUNTIME_RESERVE_GB, GpuSpec, get_gpu
from pipeline.config.model_info import ModelInfo
from pipeline.errors import SpecError
from pipeline.quant_formats import FP8_MIN_SM, KV_CACHE_FORMATS, WEIGHT_FORMATS

__all__ = [
    "GB",
    "CapacityError",
    "CapacityPlan",
    "CapacityRequest",
    "DraftModel",
    "ParamCount",
    "capacity_table",
    "count_params",
    "kv_bytes_per_sequence",
    "kv_bytes_per_token",
    "plan_capacity",
    "weight_bytes_per_param",
]

GB = 1e9
KIB = 1024
DEFAULT_MAX_NUM_TOKENS = 8192  # trtllm-build's default --max_num_tokens (tensorrt_llm/commands/build.py)
MAX_BATCH_SIZE_CAP = 2048  # trtllm-build default max_batch_size
_SIXTEEN_BIT = 2.0


class CapacityError(SpecError):
    """The model in this format cannot run on the chosen GPUs at all."""

    default_hint = "use more GPUs (build.tp_size), a smaller weight format (fp8, int4_awq) or a shorter build.max_seq_len"


@dataclass(frozen=True)
class CapacityPlan:
    model: str
    gpu: GpuSpec
    tp: int
    quant_algo: str
    kv_cache_dtype: str
    max_seq_len: int
    max_batch_size: int
    kv_cache_free_gpu_mem_fraction: float
    tokens_per_block: int
    reserve_gb: float
    params: ParamCount
    weight_bytes: float  # whole model
    weight_bytes_per_gpu: float
    kv_bytes_per_token: int  # per GPU
    kv_space_bytes: float  # per GPU
    kv_tokens: int  # tokens the cache holds (each GPU holds its share of every token)
    full_sequences: int  # max_seq_len-long sequences that fit, block-rounded
    recommended_max_batch_size: int
    recommended_max_num_tokens: int
    fits: bool  # max_batch_size sequences of max_seq_len tokens fit in the KV cache
    decode_tokens_per_s_b1: float | None  # bandwidth bound at batch 1 (datasheet bandwidth)
    notes: tuple[str, ...]
    draft: DraftCapacity | None = None  # the draft engine of draft-target decoding, on the same GPUs
    kv_bytes_per_sequence: int = 0  # per GPU, one max_seq_len-token sequence, block-rounded (windowed layers capped)
    windowed_layers: int = 0  # layers that keep only their attention window
    read_bytes_per_step: float = 0.0  # per GPU: the weights one decoding step reads (decoder's active part + output projection)

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k not in ("gpu", "params", "draft")}
        draft = None if self.draft is None else {**self.draft.__dict__, "params": self.draft.params.total}
        return {**data, "gpu": self.gpu.name, "params_total": self.params.total, "draft": draft}


@dataclass(frozen=True)
class DraftModel:
    """The draft of draft-target decoding as the planner sees it: its model, formats and longest sequence."""

    model: ModelInfo
    quant_algo: str
    kv_cache_dtype: str
    max_seq_len: int


@dataclass(frozen=True)
class DraftCapacity:
    model: str
    params: ParamCount
    weight_bytes_per_gpu: float
    kv_bytes_per_token: int  # per GPU
    kv_space_bytes: float  # per GPU
    full_sequences: int


@dataclass(frozen=True)
class CapacityRequest:
    """What the planner sizes: `model` in `quant_algo` weights with a `kv_cache_dtype` KV cache on `tp` × `gpu`, built
    for `max_seq_len` and `max_batch_size` (trtllm-build's defaults elsewhere); a `draft` for draft-target decoding,
    `windows` the target's per-layer attention windows (None: full attention)."""

    model: ModelInfo
    quant_algo: str
    kv_cache_dtype: str
    gpu: GpuSpec  # a name is looked up on construction
    max_seq_len: int
    max_batch_size: int = MAX_BATCH_SIZE_CAP
    tp: int = 1
    kv_cache_free_gpu_mem_fraction: float = 0.9
    tokens_per_block: int = 32
    group_size: int = 128
    reserve_gb: float = RUNTIME_RESERVE_GB
    tied_embeddings: bool | None = None
    draft: DraftModel | None = None
    windows: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        # one normal form from construction on: a GpuSpec, formats as their string values, windows as a tuple
        object.__setattr__(self, "gpu", get_gpu(self.gpu))
        object.__setattr__(self, "quant_algo", str(getattr(self.quant_algo, "value", self.quant_algo)))
        object.__setattr__(self, "kv_cache_dtype", str(getattr(self.kv_cache_dtype, "value", self.kv_cache_dtype)))
        object.__setattr__(self, "windows", tuple(self.windows))


def plan_capacity(request: CapacityRequest) -> CapacityPlan:
    """How `model` in `quant_algo` with a `kv_cache_dtype` KV cache fits `tp` × `gpu`; CapacityError if it cannot run.

    With a `draft` (draft-target decoding) both engines' weights stay on the GPUs and every sequence has KV in both
    caches. Each tensorrt_llm model takes kv_cache_free_gpu_mem_fraction of the memory free when it loads: the target is
    taken to load first, the draft then gets the fraction of what the target left.

    `windows` (one per layer, None: full attention) are the per-layer attention windows the target's runtime keeps
    (pipeline.config.families.Family.runtime_windows): a windowed layer holds at most its window per sequence."""
    _check_inputs(request.model, request.tp, request.max_seq_len, request.max_batch_size, request.kv_cache_free_gpu_mem_fraction, request.tokens_per_block)
    params = count_params(request.model, tied_embeddings=request.tied_embeddings)
    sixteen_bit = (params.embedding + params.lm_head + params.final_norm) * _SIXTEEN_BIT
    weights = params.decoder * weight_bytes_per_param(request.quant_algo, request.group_size) + sixteen_bit
    per_gpu = weights / request.tp
    label = f"{request.model.path.name} ({request.quant_algo if WEIGHT_FORMATS[request.quant_algo].quantized else '16-bit'} weights)"
    budget = request.gpu.memory_gb * GB - request.reserve_gb * GB
    draft_weights = _weights(request.draft.model, request.draft.quant_algo, request.group_size) / request.tp if request.draft is not None else 0.0
    if request.draft is not None:
        label += f" + draft {request.draft.model.path.name}"
    per_gpu_all = per_gpu + draft_weights
    if per_gpu_all > budget:
        per_gpu = per_gpu_all
        hint = _tp_hint(weights, request.gpu, request.reserve_gb, request.model, request.tp)
        raise CapacityError(
            f"{label} needs {per_gpu / GB:.1f} GB of weights per GPU (tp {request.tp}) plus a {request.reserve_gb:g} GB runtime reserve, "
            f"but {request.gpu.name} has {request.gpu.memory_gb:g} GB: {(per_gpu - budget) / GB:.1f} GB missing{hint}"
        )
    kv_token = kv_bytes_per_token(request.model, request.kv_cache_dtype, request.tp, request.windows)
    kv_space = request.kv_cache_free_gpu_mem_fraction * (budget - per_gpu_all)
    one_sequence = kv_bytes_per_sequence(request.model, request.kv_cache_dtype, request.tp, request.max_seq_len, request.tokens_per_block, request.windows)
    if kv_space < one_sequence:
        missing = one_sequence / request.kv_cache_free_gpu_mem_fraction - (budget - per_gpu_all)
        raise CapacityError(
            f"{label} on {request.tp} × {request.gpu.name}: the KV cache gets {kv_space / GB:.2f} GB but one {request.max_seq_len}-token sequence "
            f"needs {one_sequence / GB:.2f} GB ({_kv_label(request.kv_cache_dtype)} KV): {missing / GB:.2f} GB missing"
        )
    # Tokens the cache holds at the full-attention layers' rate (windowed layers add a fixed cost per sequence).
    kv_tokens = int(kv_space // kv_token) if kv_token else int(kv_space // kv_bytes_per_layer_token(request.model, request.kv_cache_dtype, request.tp))
    full_sequences = int(kv_space // one_sequence)
    draft_capacity = None
    if request.draft is not None:
        draft_capacity = _draft_capacity(
            request.draft,
            request.tp,
            draft_weights,
            (budget - per_gpu_all - kv_space) * request.kv_cache_free_gpu_mem_fraction,
            request.tokens_per_block,
            label,
        )
        full_sequences = min(full_sequences, draft_capacity.full_sequences)
    batch = min(request.max_batch_size, full_sequences)
    num_tokens = min(DEFAULT_MAX_NUM_TOKENS, batch * request.max_seq_len)
    num_tokens = max(request.tokens_per_block, num_tokens // request.tokens_per_block * request.tokens_per_block)
    # a step reads the decoder (a MoE's top-k experts only) and the output projection (the embedding when tied)
    read_per_step = (
        params.read_per_token * weight_bytes_per_param(request.quant_algo, request.group_size) + (params.embedding + params.final_norm) * _SIXTEEN_BIT
    ) / request.tp
    decode = request.gpu.bandwidth_tbps * 1e12 / read_per_step if request.gpu.bandwidth_tbps else None
    notes = _notes(request.gpu, full_sequences, request.max_batch_size, request.quant_algo, request.kv_cache_dtype)
    return CapacityPlan(
        model=request.model.path.name,
        gpu=request.gpu,
        tp=request.tp,
        quant_algo=request.quant_algo,
        kv_cache_dtype=request.kv_cache_dtype,
        max_seq_len=request.max_seq_len,
        max_batch_size=request.max_batch_size,
        kv_cache_free_gpu_mem_fraction=request.kv_cache_free_gpu_mem_fraction,
        tokens_per_block=request.tokens_per_block,
        reserve_gb=request.reserve_gb,
        params=params,
        weight_bytes=weights,
        weight_bytes_per_gpu=per_gpu,
        kv_bytes_per_token=kv_token,
        kv_space_bytes=kv_space,
        kv_tokens=kv_tokens,
        full_sequences=full_sequences,
        recommended_max_batch_size=batch,
        recommended_max_num_tokens=num_tokens,
        fits=full_sequences >= request.max_batch_size,
        decode_tokens_per_s_b1=decode,
        notes=notes,
        draft=draft_capacity,
        kv_bytes_per_sequence=one_sequence,
        windowed_layers=sum(w is not None for w in request.windows),
        read_bytes_per_step=read_per_step,
    )


def _weights(model: ModelInfo, quant_algo: str, group_size: int) -> float:
    params = count_params(model)
    return params.decoder * weight_bytes_per_param(quant_algo, group_size) + (params.embedding + params.lm_head + params.final_norm) * _SIXTEEN_BIT


def _draft_capacity(draft: DraftModel, tp: int, weights_per_gpu: float, kv_space: float, tokens_per_block: int, label: str) -> DraftCapacity:
    kv_token = kv_bytes_per_token(draft.model, draft.kv_cache_dtype, tp)
    blocks_per_seq = -(-draft.max_seq_len // tokens_per_block)
    one_sequence = blocks_per_seq * tokens_per_block * kv_token
    if kv_space < one_sequence:
        raise CapacityError(
            f"{label}: the draft's KV cache gets {kv_space / GB:.2f} GB (kv_cache_free_gpu_mem_fraction of what the target "
            f"leaves) but one {draft.max_seq_len}-token sequence needs {one_sequence / GB:.2f} GB; lower "
            "serve.kv_cache_free_gpu_mem_fraction (NVIDIA's draft-target example uses 0.5 for each model)"
        )
    return DraftCapacity(
        model=draft.model.path.name,
        params=count_params(draft.model),
        weight_bytes_per_gpu=weights_per_gpu,
        kv_bytes_per_token=kv_token,
        kv_space_bytes=kv_space,
        full_sequences=int(kv_space // kv_token) // tokens_per_block // blocks_per_seq,
    )


def _check_inputs(model: ModelInfo, tp: int, max_seq_len: int, max_batch_size: int, fraction: float, tokens_per_block: int) -> None:
    if tp < 1 or model.num_heads % tp:
        raise SpecError(f"tp {tp} must be >= 1 and divide the model's {model.num_heads} attention heads")
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        raise SpecError(f"tp {tp} must divide the model's {model.num_kv_heads} KV heads or be a multiple of them")
    if max_seq_len < 1 or max_batch_size < 1 or tokens_per_block < 1:
        raise SpecError(f"max_seq_len ({max_seq_len}), max_batch_size ({max_batch_size}) and tokens_per_block ({tokens_per_block}) must be >= 1")
    if not 0.0 < fraction <= 1.0:
        raise SpecError(f"kv_cache_free_gpu_mem_fraction must be in (0, 1], got {fraction}")


def _tp_hint(weights: float, gpu: GpuSpec, reserve_gb: float, model: ModelInfo, tp: int) -> str:
    for candidate in (2, 4, 8, 16):
        if candidate > tp and model.num_heads % candidate == 0 and weights / candidate < (gpu.memory_gb - reserve_gb) * GB:
            return f" (the weights fit with tp {candidate})"
    return ""


def _notes(gpu: GpuSpec, full_sequences: int, max_batch_size: int, quant_algo: str, kv: str) -> tuple[str, ...]:
    notes = []
    if full_sequences < max_batch_size:
        notes.append(f"only {full_sequences} full-length sequences fit; max_batch_size {max_batch_size} relies on shorter sequences")
    if full_sequences < 8:
        notes.append("not practical: fewer than 8 full-length sequences fit")
    if gpu.compute_capability < FP8_MIN_SM and _needs_fp8_tensor_cores(quant_algo, kv):
        notes.append(f"{gpu.name} (SM {gpu.compute_capability / 10:.1f}) has no FP8: the build will refuse this format")
    if gpu.source.startswith("[inf]"):
        notes.append(f"{gpu.name} figures are datasheet values, not measured on such a card: {gpu.source}")
    return tuple(notes)


def _kv_label(kv_cache_dtype: str) -> str:
    kv = KV_CACHE_FORMATS.get(kv_cache_dtype)
    return "16-bit" if kv is not None and not kv.quantized else kv_cache_dtype


def _needs_fp8_tensor_cores(quant_algo: str, kv_cache_dtype: str) -> bool:
    """FP8 math: a format whose lowest GPU is SM 8.9 (an NVFP4 checkpoint's SM 10.0 is a build error, not this note)."""
    kv = KV_CACHE_FORMATS.get(kv_cache_dtype)
    return FP8_MIN_SM in (WEIGHT_FORMATS[quant_algo].min_sm, kv.min_sm if kv is not None else None)


def capacity_table(plan: CapacityPlan) -> Any:
    """A rich Table of the plan for the CLI (`plan CONFIG --gpu ...`)."""
    from rich.table import Table

    table = Table(title=f"{plan.model} · {plan.quant_algo} weights · {plan.kv_cache_dtype} KV · {plan.tp} × {plan.gpu.name}")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    rows = [
        ("parameters", f"{plan.params.total / 1e9:.2f} B"),
        ("weights (all GPUs)", f"{plan.weight_bytes / GB:.1f} GB"),
        ("weights per GPU", f"{plan.weight_bytes_per_gpu / GB:.1f} GB"),
        ("GPU memory / runtime reserve", f"{plan.gpu.memory_gb:g} GB / {plan.reserve_gb:g} GB"),
        (f"KV space per GPU (× {plan.kv_cache_free_gpu_mem_fraction:g})", f"{plan.kv_space_bytes / GB:.1f} GB"),
        ("KV bytes per token per GPU" + (" (full-attention layers)" if plan.windowed_layers else ""), f"{plan.kv_bytes_per_token / KIB:g} KiB"),
        (
            f"KV per {plan.max_seq_len}-token sequence per GPU" + (f" ({plan.windowed_layers} windowed layers capped)" if plan.windowed_layers else ""),
            f"{plan.kv_bytes_per_sequence / 2**20:,.1f} MiB",
        ),
        ("tokens in the KV cache", f"{plan.kv_tokens:,}"),
        (f"full {plan.max_seq_len}-token sequences", f"{plan.full_sequences:,}"),
        ("recommended max_batch_size", f"{plan.recommended_max_batch_size:,}"),
        ("recommended max_num_tokens", f"{plan.recommended_max_num_tokens:,}"),
        ("batch-1 decode bound", f"{plan.decode_tokens_per_s_b1:,.0f} tok/s" if plan.decode_tokens_per_s_b1 else "n/a"),
        (f"max_batch_size {plan.max_batch_size} at full length", "fits" if plan.fits else "does not fit"),
    ]
    if plan.draft is not None:
        d = plan.draft
        rows += [
            (f"draft {d.model}: weights per GPU", f"{d.weight_bytes_per_gpu / GB:.1f} GB"),
            ("draft KV space per GPU / bytes per token", f"{d.kv_space_bytes / GB:.1f} GB / {d.kv_bytes_per_token / KIB:g} KiB"),
            ("full sequences in the draft's KV cache", f"{d.full_sequences:,}"),
        ]
    for name, value in rows:
        table.add_row(name, value)
    if plan.notes:
        table.caption = "\n".join(plan.notes)
    return table
