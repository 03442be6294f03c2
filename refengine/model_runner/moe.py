"""The mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE) of the Llama decoder, from TensorRT-LLM's MoE layout.

Checkpoint (TensorRT-LLM `layers/moe.py`, written by pipeline/quantization/trtllm_checkpoint/moe.py), under
`transformer.layers.N.mlp`:

  * `router.weight` [E, hidden] float32 (never quantized);
  * `fc.weight` [E, 2·I, hidden]: per expert the up rows, then the gate rows; `proj.weight` [E, hidden, I];
    FP8: `weights_scaling_factor` (E, 1) per expert and one `activation_scaling_factor` [1] for all experts;
  * Qwen2-MoE's shared expert: `shared_expert.fc` [up; gate] / `shared_expert.proj` (ordinary Linears, per-tensor
    FP8 scales) and `shared_expert_gate.weight` [1, hidden]: its output is scaled by sigmoid(x · gate).

Routing is TensorRT-LLM's (and transformers'): softmax over the E router logits in float32, the top k, and with
`normalization_mode` RENORMALIZE the k weights divided by their sum (NONE keeps them as they are).

The expert work is batched by expert, not by token: the (token, expert) pairs of a step are sorted by expert, the
routed rows gathered once, each expert runs one GEMM for fc and one for proj over all of its rows, and the outputs,
times their routing weights, are added back into their tokens' rows with one `index_add_`. Each expert is a Linear
over its slice of the stacked weight (`DenseLinear`: the same fp16 storage and fp16-weight GEMM as the dense
layers; `Fp8Linear` with the expert's weight scale and the shared activation scale).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from refengine.checkpoint import TensorStore
from refengine.errors import ModelLoadError
from refengine.model_config import ModelConfig
from refengine.model_runner.linear import DenseLinear, Linear, LinearSpec, WeightScratch, is_excluded, load_linear, weight_storage
from refengine.model_runner.quantized_linear import FP8_CODES, Fp8Linear

_QWEN_MOE_TYPES = ("qwen2_moe", "qwen3_moe")


@dataclass(frozen=True)
class MoeSpec:
    """The shape and routing of the experts, from config.json (checked by the family's row in architectures.py)."""

    num_experts: int
    top_k: int
    renormalize: bool  # moe.normalization_mode 1 RENORMALIZE (the default) vs 0 NONE
    intermediate_size: int  # of each expert
    shared_intermediate_size: int = 0  # Qwen2-MoE's shared expert; 0: none

    @classmethod
    def from_config(cls, raw: Mapping[str, Any], config: ModelConfig) -> MoeSpec | None:
        moe = raw.get("moe") or {}
        if not moe.get("num_experts"):
            return None
        qwen = raw.get("qwen_type") in _QWEN_MOE_TYPES
        return cls(
            num_experts=int(moe["num_experts"]),
            top_k=int(moe["top_k"]),
            renormalize=moe.get("normalization_mode", 1) == 1,
            intermediate_size=int(raw["moe_intermediate_size"]) if qwen else config.intermediate_size,
            shared_intermediate_size=int(raw.get("moe_shared_expert_intermediate_size") or 0) if qwen else 0,
        )


@dataclass
class SharedExpert:
    fc: Linear  # [up; gate] rows
    proj: Linear
    gate: torch.Tensor  # [1, hidden]: the output is scaled by sigmoid(x · gate)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(_gated(self.fc(x), self.proj.in_features)).mul_(torch.sigmoid(F.linear(x, self.gate)))


class MoeBlock:
    """x [tokens, hidden] -> the weighted sum of its top-k experts' SwiGLU MLPs (plus the shared expert)."""

    def __init__(self, spec: MoeSpec, router: torch.Tensor, fc: list[Linear], proj: list[Linear], shared: SharedExpert | None = None) -> None:
        self.spec = spec
        self.router = router  # [E, hidden] float32
        self.fc = fc  # per expert, [2·I, hidden]
        self.proj = proj  # per expert, [hidden, I]
        self.shared = shared

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [tokens, k] in x's dtype, experts [tokens, k]) of each token."""
        probabilities = torch.softmax(F.linear(x.to(torch.float32), self.router), dim=-1)
        weights, experts = torch.topk(probabilities, self.spec.top_k, dim=-1)
        if self.spec.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self.route(x)
        top_k, inner = self.spec.top_k, self.spec.intermediate_size
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert, tokens in order
        counts = torch.bincount(flat, minlength=self.spec.num_experts).tolist()
        tokens = order // top_k
        gathered = x[tokens]
        outputs = torch.empty_like(gathered)
        start = 0
        for expert, count in enumerate(counts):
            if count:
                rows = slice(start, start + count)
                outputs[rows] = self.proj[expert](_gated(self.fc[expert](gathered[rows]), inner))
                start += count
        outputs.mul_(weights.reshape(-1)[order].unsqueeze(1))
        routed = torch.zeros_like(x).index_add_(0, tokens, outputs)
        return routed if self.shared is None else routed.add_(self.shared(x))  # as transformers adds them


def _gated(up_gate: torch.Tensor, inner: int) -> torch.Tensor:
    """silu(gate) * up of a fused [up | gate] output (TensorRT-LLM's MoE fc: the up rows first)."""
    return F.silu(up_gate[:, inner:]).mul_(up_gate[:, :inner])


def load_moe(
    store: TensorStore,
    config: ModelConfig,
    spec: MoeSpec,
    prefix: str,
    dtype: torch.dtype,
    scratch: WeightScratch | None = None,
    fp16_gemm: bool = False,
) -> MoeBlock:
    """The MoE block at `prefix` (`transformer.layers.N.mlp`)."""
    hidden, inner, experts = config.hidden_size, spec.intermediate_size, spec.num_experts
    router = store.get(f"{prefix}.router.weight", (experts, hidden)).to(torch.float32)
    fc = _experts(store, config, f"{prefix}.fc", (experts, 2 * inner, hidden), dtype, scratch, fp16_gemm)
    proj = _experts(store, config, f"{prefix}.proj", (experts, hidden, inner), dtype, scratch, fp16_gemm)
    shared = None
    if spec.shared_intermediate_size:
        size, checkpoint_dtype = spec.shared_intermediate_size, getattr(torch, config.dtype)

        def linear(name: str, in_features: int, out_features: int) -> Linear:
            return load_linear(
                store, LinearSpec(f"{prefix}.{name}", in_features, out_features), config.quantization, dtype, checkpoint_dtype, scratch, fp16_gemm
            )

        gate = store.get(f"{prefix}.shared_expert_gate.weight", (1, hidden)).to(dtype)
        shared = SharedExpert(linear("shared_expert.fc", hidden, 2 * size), linear("shared_expert.proj", size, hidden), gate)
    return MoeBlock(spec, router, fc, proj, shared)


def _experts(
    store: TensorStore,
    config: ModelConfig,
    prefix: str,
    shape: tuple[int, int, int],
    dtype: torch.dtype,
    scratch: WeightScratch | None,
    fp16_gemm: bool,
) -> list[Linear]:
    """One Linear per expert over its slice of the stacked weight [E, out, in]."""
    if store.has(f"{prefix}.bias"):
        raise ModelLoadError(f"tensor {prefix}.bias: MoE experts with a bias are not supported")
    quantization = config.quantization
    algo = quantization.quant_algo
    if algo is None or is_excluded(prefix, quantization):
        weight = store.get(f"{prefix}.weight", shape)
        return [DenseLinear(weight_storage(expert, dtype), None, dtype, scratch, fp16_gemm) for expert in weight]
    if algo != "FP8":
        raise ModelLoadError(f"{prefix}: quant_algo {algo} is not supported for MoE experts (supported: FP8, or unquantized)")
    codes = store.get_quantized(f"{prefix}.weight", shape, FP8_CODES)
    scales = store.get(f"{prefix}.weights_scaling_factor", (shape[0], 1)).to(torch.float32)
    input_scale = store.get_scalar(f"{prefix}.activation_scaling_factor")
    for name, tensor in (("weights_scaling_factor", scales), ("activation_scaling_factor", input_scale)):
        if not bool(torch.all(torch.isfinite(tensor) & (tensor > 0))):
            raise ModelLoadError(f"tensor {prefix}.{name!r} must hold positive finite scales")
    return [Fp8Linear(expert, scale.reshape(()), input_scale, None) for expert, scale in zip(codes, scales)]
