"""The Llama-family decoder (Llama 2/3, Mistral, Qwen2) over a paged KV cache: a `DecoderModel`.

Weights come from a TensorRT-LLM checkpoint (names: shared/reference/trtllm.md §2.4) and are
computed in the compute dtype (float32 by default, so results match transformers in float32);
dense Linear weights whose checkpoint dtype widens exactly (fp16/bf16 → float32) stay in it and
are widened right before each GEMM (`linear.DenseLinear`), the same values at half the bytes.
Quantized checkpoints keep their codes and scales: each Linear executes its `quant_algo`
(`quantized_linear.py`) and a quantized KV cache stores codes (`kv_quant.py`); embeddings, norms
and lm_head stay unquantized.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from refengine.checkpoint import Checkpoint, TensorStore
from refengine.model_config import ModelConfig
from refengine.model_runner.attention import AttentionMetadata, paged_attention, write_kv_cache
from refengine.model_runner.decoder import KVCacheLayout
from refengine.model_runner.kv_quant import KVCacheQuantizer, kv_cache_dtype, load_kv_cache_quantizer
from refengine.model_runner.layers import RotaryEmbedding, rms_norm, rotate, swiglu
from refengine.model_runner.linear import DenseLinear, Linear, LinearSpec, WeightScratch, load_linear, weight_storage
from refengine.model_runner.quantized_linear import check_quantization


@dataclass
class DecoderLayer:
    input_norm: torch.Tensor
    qkv: Linear
    dense: Linear
    post_norm: torch.Tensor
    fc: Linear  # gate projection (HF gate_proj)
    gate: Linear  # up projection (HF up_proj)
    proj: Linear  # down projection (HF down_proj)
    kv_quant: KVCacheQuantizer | None = None  # set when the KV cache is quantized


class LlamaModel:
    def __init__(
        self,
        config: ModelConfig,
        embedding: torch.Tensor,
        layers: list[DecoderLayer],
        final_norm: torch.Tensor,
        lm_head: torch.Tensor,
        scratch: WeightScratch | None = None,
        fp16_gemm: bool = False,
    ) -> None:
        self.config = config
        self.embedding = embedding
        self.layers = layers
        self.final_norm = final_norm
        # The output projection; may be stored narrower than the compute dtype (see DenseLinear).
        self._logits = DenseLinear(lm_head, None, embedding.dtype, scratch, fp16_gemm)
        self.rotary = RotaryEmbedding(config.head_size, config.rotary_base, config.rope_scaling)
        self.scale = config.head_size**-0.5

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding.dtype

    @property
    def lm_head(self) -> torch.Tensor:
        """The output projection [vocab, hidden] in the compute dtype (the embedding table when tied)."""
        weight = self._logits.weight
        return weight if weight.dtype == self.dtype else weight.to(self.dtype)

    @property
    def kv_cache_dtype(self) -> torch.dtype:
        """The dtype of the paged KV tensors (float8_e4m3fn / int8 codes when the cache is quantized)."""
        return kv_cache_dtype(self.config.kv_cache_quant_algo, self.dtype)

    @property
    def kv_cache_layout(self) -> KVCacheLayout:
        config = self.config
        return KVCacheLayout(config.num_layers, config.num_kv_heads, config.head_size, self.kv_cache_dtype)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, dtype: torch.dtype = torch.float32, fp16_gemm: bool = False) -> LlamaModel:
        """`fp16_gemm`: dense Linears holding fp16 values run on fbgemm's fp16-weight GEMM (see `DenseLinear`)."""
        config = checkpoint.config
        check_quantization(config.quantization)
        store = checkpoint.tensors
        table_shape = (config.vocab_size, config.hidden_size)
        embedding = store.get("transformer.vocab_embedding.weight", table_shape).to(dtype)
        lm_head = store.get_optional("lm_head.weight", table_shape)
        # Tied embeddings (no lm_head.weight): the output projection is the embedding table.
        lm_head = embedding if lm_head is None else weight_storage(lm_head, dtype)
        scratch = WeightScratch()  # shared by the model's Linears whose weights are kept narrower
        layers = [_load_layer(store, config, index, dtype, scratch, fp16_gemm) for index in range(config.num_layers)]
        final_norm = store.get("transformer.ln_f.weight", (config.hidden_size,))
        return cls(config, embedding, layers, final_norm.to(dtype), lm_head, scratch, fp16_gemm)

    def forward(
        self,
        input_ids: torch.Tensor,
        kv_caches: list[torch.Tensor],
        metadata: AttentionMetadata,
        last_token_of: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Final hidden states of a flat token batch: [num_tokens, hidden], or, with
        `last_token_of` (sequence indices), only the last token of each of those sequences,
        [len(last_token_of), hidden].

        With `last_token_of`, the last layer still writes every token's K/V (later steps read
        them) but runs its attention, output projection, MLP and the final norm only for the rows
        returned: nothing reads the other rows' outputs (a prompt's earlier tokens are never
        sampled from). This skips about a quarter of a prompt's compute.
        """
        config = self.config
        eps, num_heads, head_size = config.norm_epsilon, config.num_heads, config.head_size
        qk_size = config.q_size + config.kv_size
        hidden = F.embedding(input_ids, self.embedding)
        cos, sin = self.rotary.cos_sin(metadata.positions)
        # Broadcast over heads and cast once per step, not per layer and per q / k.
        cos, sin = cos.unsqueeze(1).to(hidden.dtype), sin.unsqueeze(1).to(hidden.dtype)
        num_tokens = input_ids.shape[0]
        last = len(self.layers) - 1
        # Nothing to prune when every row is already the one token of a sequence asked for.
        prune = last_token_of is not None and list(last_token_of) != list(range(num_tokens))
        for index, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            qkv = layer.qkv(rms_norm(hidden, layer.input_norm, eps))
            # RoPE on query and key heads together: one elementwise pass instead of two.
            query_key = rotate(qkv[:, :qk_size].reshape(num_tokens, -1, head_size), cos, sin)
            query, key = query_key[:, :num_heads], query_key[:, num_heads:]
            value = qkv[:, qk_size:].reshape(num_tokens, config.num_kv_heads, head_size)
            write_kv_cache(kv_cache, key, value, metadata.slot_mapping, layer.kv_quant)
            if index == last and prune:
                rows, kept = metadata.last_tokens(last_token_of)
                query, hidden, num_tokens = query[rows], hidden[rows], len(rows)
                attention = paged_attention(query, kv_cache, kept, self.scale, layer.kv_quant)
            else:
                attention = paged_attention(query, kv_cache, metadata, self.scale, layer.kv_quant, key, value)
            # residual + f(x), added in place into f's fresh output (addition commutes exactly)
            hidden = layer.dense(attention.reshape(num_tokens, config.q_size)).add_(hidden)
            normed = rms_norm(hidden, layer.post_norm, eps)
            hidden = layer.proj(swiglu(layer.fc(normed), layer.gate(normed))).add_(hidden)
        return rms_norm(hidden, self.final_norm, eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._logits(hidden).to(torch.float32)


def _load_layer(
    store: TensorStore, config: ModelConfig, index: int, dtype: torch.dtype, scratch: WeightScratch | None = None, fp16_gemm: bool = False
) -> DecoderLayer:
    prefix = f"transformer.layers.{index}"
    hidden, inner = config.hidden_size, config.intermediate_size
    checkpoint_dtype = getattr(torch, config.dtype)

    def linear(name: str, in_features: int, out_features: int, bias_required: bool) -> Linear:
        spec = LinearSpec(f"{prefix}.{name}", in_features, out_features, bias_required)
        return load_linear(store, spec, config.quantization, dtype, checkpoint_dtype, scratch, fp16_gemm)

    return DecoderLayer(
        input_norm=store.get(f"{prefix}.input_layernorm.weight", (hidden,)).to(dtype),
        qkv=linear("attention.qkv", hidden, config.q_size + 2 * config.kv_size, config.qkv_bias_required),
        dense=linear("attention.dense", config.q_size, hidden, config.dense_bias_required),
        post_norm=store.get(f"{prefix}.post_layernorm.weight", (hidden,)).to(dtype),
        fc=linear("mlp.fc", hidden, inner, config.mlp_bias_required),
        gate=linear("mlp.gate", hidden, inner, config.mlp_bias_required),
        proj=linear("mlp.proj", inner, hidden, config.mlp_bias_required),
        kv_quant=load_kv_cache_quantizer(store, f"{prefix}.attention", config.kv_cache_quant_algo),
    )
