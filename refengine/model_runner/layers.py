"""Llama building blocks: RMSNorm, rotary position embedding (incl. llama3 scaling), SwiGLU.

Numerics follow Hugging Face transformers' Llama implementation, so that float32 runs agree.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from refengine.model_config import RopeScaling, RopeScalingType


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, epsilon: float) -> torch.Tensor:
    input_dtype = hidden.dtype
    hidden32 = hidden.to(torch.float32)
    variance = hidden32.pow(2).mean(-1, keepdim=True)
    return weight * (hidden32 * torch.rsqrt(variance + epsilon)).to(input_dtype)


def swiglu(gate_out: torch.Tensor, up_out: torch.Tensor) -> torch.Tensor:
    """silu(x W_fc) * (x W_gate): TensorRT-LLM's `mlp.fc` is HF's gate_proj, `mlp.gate` its up_proj."""
    return F.silu(gate_out) * up_out


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
    smooth = (old_context_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
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
        cos = cos.unsqueeze(1).to(x.dtype)
        sin = sin.unsqueeze(1).to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin
