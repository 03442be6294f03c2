"""Gemma, Gemma 2 and Gemma 3 (text) over the paged KV cache: a `DecoderModel`.

The Llama decoder's pieces (llama.py: the layer's Linears, RMSNorm, RoPE, paged attention) with Gemma's
differences (refengine/gemma_options.py reads them from the checkpoint config):

- embeddings scaled by √hidden (in the compute dtype, as transformers' `embed_scale`);
- RMSNorm multiplies by the stored weight, which the checkpoint holds as 1 + w (the converter and ModelOpt
  add the one: TensorRT-LLM's RMSNorm is plain), so `rms_norm` is Gemma's (1 + w) norm;
- GeGLU MLP with tanh GELU;
- Gemma 2 / 3: the attention output and the MLP output pass through their own norm before the residual
  (`post_layernorm` = Hugging Face's post_attention_layernorm, `post_feedforward_layernorm`), and the MLP input
  through `pre_feedforward_layernorm`; scores scaled by query_pre_attn_scalar ** -0.5;
- Gemma 2: attention scores soft-capped (c · tanh(s / c)); Gemma 2 / 3: final logits soft-capped;
- Gemma 3: q and k RMSNorm per head before RoPE; local layers use `rope_local_base_freq` (no scaling);
- sliding-window layers attend to the keys in (p − W, p] (attention.causal_attention).

The KV cache is the Llama one: every layer holds the whole sequence, and a windowed layer masks what lies outside
its window (kv_cache/windows.py says why, and what TensorRT-LLM's per-window pools hold instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from refengine.checkpoint import Checkpoint, TensorStore
from refengine.gemma_options import GemmaOptions
from refengine.lora.batch import LoraBatch
from refengine.lora.modules import ModelLoraShape, Site
from refengine.model_config import ModelConfig, RopeScaling
from refengine.model_runner.attention import AttentionMetadata, paged_attention, write_kv_cache
from refengine.model_runner.decoder import KVCacheLayout
from refengine.model_runner.kv_quant import kv_cache_dtype
from refengine.model_runner.layers import RotaryEmbedding, geglu, rms_norm, rotate
from refengine.model_runner.linear import DenseLinear, WeightScratch
from refengine.model_runner.llama import DecoderLayer, _load_layer, linear_with_lora, load_embeddings, loaded
from refengine.model_runner.quantized_linear import check_quantization


@dataclass
class GemmaLayer:
    base: DecoderLayer  # input norm, qkv, dense, post(-attention) norm, fc / gate / proj, KV quantizer
    pre_ff_norm: torch.Tensor | None = None  # Gemma 2 / 3
    post_ff_norm: torch.Tensor | None = None  # Gemma 2 / 3
    qk_norm: torch.Tensor | None = None  # Gemma 3: [num_heads + num_kv_heads, head_size], q's then k's weight
    window: int | None = None  # sliding-window layer's window


class GemmaModel:
    def __init__(
        self,
        config: ModelConfig,
        options: GemmaOptions,
        embedding: torch.Tensor,
        layers: list[GemmaLayer],
        final_norm: torch.Tensor,
        lm_head: torch.Tensor,
        scratch: WeightScratch | None = None,
        fp16_gemm: bool = False,
    ) -> None:
        self.config = config
        self.options = options
        self.embedding = embedding
        self.layers = layers
        self.final_norm = final_norm
        self._logits = DenseLinear(lm_head, None, embedding.dtype, scratch, fp16_gemm)
        self.rotary = RotaryEmbedding(config.head_size, config.rotary_base, config.rope_scaling)
        base = options.local_rotary_base
        self.local_rotary = None if base is None else RotaryEmbedding(config.head_size, base, RopeScaling())
        self.scale = float(options.query_pre_attn_scalar or config.head_size) ** -0.5
        self.embed_scale = torch.tensor(config.hidden_size**0.5, dtype=embedding.dtype)

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding.dtype

    @property
    def kv_cache_layout(self) -> KVCacheLayout:
        config = self.config
        return KVCacheLayout(config.num_layers, config.num_kv_heads, config.head_size, kv_cache_dtype(config.kv_cache_quant_algo, self.dtype))

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def lora_shape(self) -> ModelLoraShape:
        config = self.config
        return ModelLoraShape(config.num_layers, config.hidden_size, config.q_size, config.kv_size, config.intermediate_size)

    @property
    def max_request_tokens(self) -> int | None:
        """Prompt + max_tokens a request may ask for (Gemma 2 without its window in the checkpoint), or None."""
        return self.options.max_request_tokens

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, dtype: torch.dtype = torch.float32, fp16_gemm: bool = False) -> GemmaModel:
        config = checkpoint.config
        options = GemmaOptions.from_config(checkpoint.raw_config)
        check_quantization(config.quantization)
        store = checkpoint.tensors
        embedding, lm_head = load_embeddings(store, config, dtype)
        scratch = WeightScratch()
        layers = [
            _load_gemma_layer(store, config, options, index, _load_layer(store, config, index, dtype, scratch, fp16_gemm, options.qk_layernorm), dtype)
            for index in range(config.num_layers)
        ]
        final_norm = store.get("transformer.ln_f.weight", (config.hidden_size,)).to(dtype)
        return cls(config, options, embedding, layers, final_norm, lm_head, scratch, fp16_gemm)

    def forward(
        self,
        input_ids: torch.Tensor,
        kv_caches: list[torch.Tensor],
        metadata: AttentionMetadata,
        last_token_of: Sequence[int] | None = None,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:
        """As `LlamaModel.forward` (the last layer runs only the rows asked for with `last_token_of`; `lora` the rows'
        adapters)."""
        config, options = self.config, self.options
        eps, num_heads, head_size = config.norm_epsilon, config.num_heads, config.head_size
        qk_size = config.q_size + config.kv_size
        hidden = F.embedding(input_ids, self.embedding) * self.embed_scale
        ropes = {False: self._cos_sin(self.rotary, metadata, hidden.dtype)}
        if self.local_rotary is not None:
            ropes[True] = self._cos_sin(self.local_rotary, metadata, hidden.dtype)
        num_tokens = input_ids.shape[0]
        last = len(self.layers) - 1
        prune_to = last_token_of if last_token_of is not None and list(last_token_of) != list(range(num_tokens)) else None
        for index, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            base = layer.base
            qkv = linear_with_lora(base.qkv, rms_norm(hidden, base.input_norm, eps), lora, index, Site.QKV)
            query_key = qkv[:, :qk_size].reshape(num_tokens, -1, head_size)
            if layer.qk_norm is not None:
                query_key = rms_norm(query_key, layer.qk_norm, eps)
            cos, sin = ropes[layer.window is not None and self.local_rotary is not None]
            query_key = rotate(query_key, cos, sin)
            query, key = query_key[:, :num_heads], query_key[:, num_heads:]
            value = qkv[:, qk_size:].reshape(num_tokens, config.num_kv_heads, head_size)
            write_kv_cache(kv_cache, key, value, metadata.slot_mapping, base.kv_quant)
            window, softcap = layer.window, options.attn_logit_softcapping
            if index == last and prune_to is not None:
                rows, kept = metadata.last_tokens(prune_to)
                query, hidden, num_tokens = query[rows], hidden[rows], len(rows)
                lora = lora.select(rows) if lora is not None else None
                attention = paged_attention(query, kv_cache, kept, self.scale, base.kv_quant, window=window, softcap=softcap)
            else:
                attention = paged_attention(query, kv_cache, metadata, self.scale, base.kv_quant, key, value, window=window, softcap=softcap)
            attention = linear_with_lora(base.dense, attention.reshape(num_tokens, config.q_size), lora, index, Site.DENSE)
            if options.inter_layernorms:
                hidden = rms_norm(attention, base.post_norm, eps).add_(hidden)
                normed = rms_norm(hidden, loaded(layer.pre_ff_norm, "pre_feedforward_layernorm", index), eps)
            else:
                hidden = attention.add_(hidden)
                normed = rms_norm(hidden, base.post_norm, eps)
            fc, gate = loaded(base.fc, "mlp.fc", index)(normed), loaded(base.gate, "mlp.gate", index)(normed)
            if lora is not None:
                lora.add(index, Site.MLP_IN, normed, (fc, gate))
            mlp = linear_with_lora(loaded(base.proj, "mlp.proj", index), geglu(fc, gate), lora, index, Site.PROJ)
            if options.inter_layernorms:
                mlp = rms_norm(mlp, loaded(layer.post_ff_norm, "post_feedforward_layernorm", index), eps)
            hidden = mlp.add_(hidden)
        return rms_norm(hidden, self.final_norm, eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self._logits(hidden).to(torch.float32)
        cap = self.options.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    @staticmethod
    def _cos_sin(rotary: RotaryEmbedding, metadata: AttentionMetadata, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = rotary.cos_sin(metadata.positions)
        return cos.unsqueeze(1).to(dtype), sin.unsqueeze(1).to(dtype)


def _load_gemma_layer(store: TensorStore, config: ModelConfig, options: GemmaOptions, index: int, base: DecoderLayer, dtype: torch.dtype) -> GemmaLayer:
    prefix = f"transformer.layers.{index}"
    hidden, head = config.hidden_size, config.head_size
    layer = GemmaLayer(base, window=options.layer_windows[index])
    if options.inter_layernorms:
        layer.pre_ff_norm = store.get(f"{prefix}.pre_feedforward_layernorm.weight", (hidden,)).to(dtype)
        layer.post_ff_norm = store.get(f"{prefix}.post_feedforward_layernorm.weight", (hidden,)).to(dtype)
    if base.q_norm is not None and base.k_norm is not None:  # one norm over q's and k's heads together
        layer.qk_norm = torch.cat((base.q_norm.expand(config.num_heads, head), base.k_norm.expand(config.num_kv_heads, head)))
    return layer
