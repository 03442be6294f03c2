"""Llama building blocks: RMSNorm, rotary position embedding (incl. llama3 scaling, partial rotary and
Phi-3's long-RoPE), SwiGLU (and Gemma's GeGLU); the GPT class's LayerNorm and ungated activations (StarCoder2,
Nemotron).

Numerics follow Hugging Face transformers' Llama implementation, so that float32 runs agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

import torch
import torch.nn.functional as F

from refengine.model_config import RopeScaling, RopeScalingType


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, epsilon: float) -> torch.Tensor:
    """weight * (x * rsqrt(mean(x²) + eps)), computed in float32 (in place on the temporaries:
    the same operations and values, fewer allocations)."""
    input_dtype = hidden.dtype
    hidden32 = hidden if input_dtype == torch.float32 else hidden.to(torch.float32)
    variance = hidden32.pow(2).mean(-1, keepdim=True)
    normed = hidden32 * variance.add_(epsilon).rsqrt_()
    if input_dtype != torch.float32:
        normed = normed.to(input_dtype)
    if weight.dtype != normed.dtype:
        return weight * normed
    return normed.mul_(weight)  # = weight * normed (multiplication commutes exactly)


def swiglu(gate_out: torch.Tensor, up_out: torch.Tensor) -> torch.Tensor:
    """silu(x W_fc) * (x W_gate): TensorRT-LLM's `mlp.fc` is HF's gate_proj, `mlp.gate` its up_proj.

    Overwrites `gate_out` (a temporary of the caller's)."""
    return F.silu(gate_out, inplace=True).mul_(up_out)


def geglu(gate_out: torch.Tensor, up_out: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(x W_fc) * (x W_gate), Gemma's MLP (transformers' gelu_pytorch_tanh). Overwrites `gate_out`."""
    return F.gelu(gate_out, approximate="tanh").mul_(up_out)


def layer_norm(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, epsilon: float) -> torch.Tensor:
    """LayerNorm over the last dimension, in float32 (TensorRT-LLM's LayerNorm, transformers' nn.LayerNorm; Nemotron's
    LayerNorm1P is this with weight + 1, which the converter stores)."""
    normed = F.layer_norm(
        hidden.to(torch.float32),
        hidden.shape[-1:],
        weight.to(torch.float32),
        None if bias is None else bias.to(torch.float32),
        epsilon,
    )
    return normed.to(hidden.dtype)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """TensorRT-LLM's `gelu` (its ACT2FN maps gelu, gelu_new and gelu_pytorch_tanh to it): the tanh approximation,
    transformers' gelu_pytorch_tanh (StarCoder2)."""
    return F.gelu(x, approximate="tanh")


def squared_relu(x: torch.Tensor) -> torch.Tensor:
    """relu(x)², TensorRT-LLM's `squared-relu` and transformers' relu2 (Nemotron). Overwrites `x` (a temporary)."""
    return F.relu(x, inplace=True).square_()


def swiglu_halves(fc_out: torch.Tensor) -> torch.Tensor:
    """TensorRT-LLM's `swiglu` over one fc output of rows [x; gate]: silu(gate) * x (tensorrt_llm/functional.py,
    v1.2.0), Phi-3's plain MLP, whose fc holds [up; gate]. Reads `fc_out`, returns a new tensor half as wide."""
    x, gate = fc_out.chunk(2, dim=-1)
    return F.silu(gate).mul_(x)


def silu(x: torch.Tensor) -> torch.Tensor:
    """silu(x), TensorRT-LLM's `silu`. Overwrites `x` (a temporary)."""
    return F.silu(x, inplace=True)


# The plain MLP's activations, proj(act(fc(x))), by the checkpoint's `hidden_act`: the GPT class (StarCoder2,
# Nemotron) and Phi-3's class (swiglu over fc's two halves; silu where a checkpoint names it, as NVIDIA runs it).
UNGATED_ACTIVATIONS = MappingProxyType({"gelu": gelu_tanh, "squared-relu": squared_relu, "swiglu": swiglu_halves, "silu": silu})
# Activations whose fc output is twice the MLP's inner size (the gate and the linear branch in one Linear)
DOUBLE_WIDTH_ACTIVATIONS = frozenset({"swiglu"})


def rope_inverse_frequencies(head_size: int, base: float, scaling: RopeScaling) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=torch.int64).to(torch.float32) / head_size))
    if scaling.type is RopeScalingType.LINEAR:
        return inv_freq / scaling.factor
    if scaling.type is RopeScalingType.LLAMA3:
        return _llama3_frequencies(inv_freq, scaling)
    return inv_freq


def _llama3_frequencies(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    old_context_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context_len / scaling.low_freq_factor
    high_freq_wavelen = old_context_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """GPT-NeoX style rotary embedding (rotate halves), as `rope_gpt_neox` in TensorRT-LLM."""

    def __init__(self, head_size: int, base: float, scaling: RopeScaling) -> None:
        self._inv_freq = rope_inverse_frequencies(head_size, base, scaling)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32).unsqueeze(1) * self._inv_freq.unsqueeze(0)
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos(), angles.sin()

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [num_tokens, heads, head_size]; cos/sin [num_tokens, head_size]."""
        return rotate(x, cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin; x [num_tokens, heads, head_size], cos/sin already
    [num_tokens, 1, head_size] in x's dtype (the model prepares them once per step)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos).add_(rotated.mul_(sin))


def rotate_partial(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """`rotate` on the first `rotary_dim` features of each head only (partial rotary); the rest pass through."""
    if rotary_dim == x.shape[-1]:
        return rotate(x, cos, sin)
    return torch.cat((rotate(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]), dim=-1)


@dataclass(frozen=True)
class LongRope:
    """Phi-3's long-RoPE (TensorRT-LLM `position_embedding_type: long_rope`): per-frequency short and long
    factors divide the inverse frequencies; a sequence longer than `original_max_position_embeddings` uses the
    long ones. Both scale cos/sin by sqrt(1 + ln(s) / ln(original)), s = max_position_embeddings / original
    (1 when s <= 1), as TensorRT-LLM's `create_sinusoidal_positions_long_rope` and transformers' longrope do."""

    original_max_position_embeddings: int
    max_position_embeddings: int
    short_factors: tuple[float, ...]
    long_factors: tuple[float, ...]

    @property
    def attention_factor(self) -> float:
        scale = self.max_position_embeddings / self.original_max_position_embeddings
        if scale <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(scale) / math.log(self.original_max_position_embeddings))


class LongRopeEmbedding:
    """Both tables of a long-RoPE model; `cos_sin` picks the long one for the rows flagged in `long_rows`."""

    def __init__(self, rotary_dim: int, base: float, long_rope: LongRope) -> None:
        shape = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
        self._short = 1.0 / (torch.tensor(long_rope.short_factors, dtype=torch.float32) * base**shape)
        self._long = 1.0 / (torch.tensor(long_rope.long_factors, dtype=torch.float32) * base**shape)
        self._factor = long_rope.attention_factor

    def _table(self, positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32).unsqueeze(1) * inv_freq.unsqueeze(0)
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos() * self._factor, angles.sin() * self._factor

    def cos_sin(self, positions: torch.Tensor, long_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [num_tokens, rotary_dim]; `long_rows` bool [num_tokens]: rows of long sequences."""
        cos, sin = self._table(positions, self._short)
        if bool(long_rows.any()):
            long_cos, long_sin = self._table(positions, self._long)
            rows = long_rows.unsqueeze(1)
            cos, sin = torch.where(rows, long_cos, cos), torch.where(rows, long_sin, sin)
        return cos, sin
