"""The Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, Granite, Phi-3/4; Mixtral, Qwen2/3-MoE; and TensorRT-LLM's
GPT class for StarCoder2 and Nemotron) over a paged KV cache: a `DecoderModel`.

The families beyond Llama are its options (`decoder_options.DecoderOptions`, read from config.json): q/k
RMSNorm, partial rotary, long-RoPE, Granite's multipliers, a mixture of experts as the MLP (`moe.py`), LayerNorm and
an ungated MLP (GPT); with none set the computation is Llama's.

Weights come from a TensorRT-LLM checkpoint (names: `transformer.layers.{i}.attention.qkv`, `mlp.fc` / `mlp.gate` / `mlp.proj`, ...) and are
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
from typing import TypeVar

import torch
import torch.nn.functional as F

from refengine.architectures import architecture_for_checkpoint
from refengine.checkpoint import Checkpoint, TensorStore
from refengine.lora.batch import LoraBatch
from refengine.lora.modules import ModelLoraShape, Site
from refengine.model_config import ModelConfig
from refengine.model_runner.attention import AttentionMetadata, paged_attention, write_kv_cache
from refengine.model_runner.decoder import KVCacheLayout
from refengine.model_runner.decoder_options import DecoderOptions, plain_options
from refengine.model_runner.kv_quant import KVCacheQuantizer, kv_cache_dtype, load_kv_cache_quantizer
from refengine.model_runner.layers import (
    DOUBLE_WIDTH_ACTIVATIONS,
    UNGATED_ACTIVATIONS,
    LongRopeEmbedding,
    RotaryEmbedding,
    layer_norm,
    rms_norm,
    rotate_partial,
    swiglu,
)
from refengine.model_runner.linear import DenseLinear, Linear, LinearSpec, WeightScratch, load_linear, weight_storage
from refengine.model_runner.moe import MoeBlock, MoeSpec, load_moe
from refengine.model_runner.quantized_linear import check_quantization

T = TypeVar("T")


@dataclass
class DecoderLayer:
    input_norm: torch.Tensor
    qkv: Linear
    dense: Linear
    post_norm: torch.Tensor
    fc: Linear | None = None  # gate projection (HF gate_proj); a plain MLP's only input projection (GPT: c_fc / up_proj;
    # Phi-3: rows [up; gate]);
    # the dense MLP's projections are None in an MoE layer
    gate: Linear | None = None  # up projection (HF up_proj); None for a plain MLP
    proj: Linear | None = None  # down projection (HF down_proj)
    kv_quant: KVCacheQuantizer | None = None  # set when the KV cache is quantized
    q_norm: torch.Tensor | None = None  # qk_layernorm: RMSNorm weights [head_size] of each q / k head
    k_norm: torch.Tensor | None = None
    input_norm_bias: torch.Tensor | None = None  # LayerNorm's (GPT class), when the checkpoint has one
    post_norm_bias: torch.Tensor | None = None
    moe: MoeBlock | None = None  # the MLP when it is a mixture of experts (Mixtral, Qwen MoE)


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
        options: DecoderOptions | None = None,
        final_norm_bias: torch.Tensor | None = None,
    ) -> None:
        self.config = config
        self.options = options = options or plain_options(config.head_size)
        self.embedding = embedding
        self.layers = layers
        self.final_norm = final_norm
        self.final_norm_bias = final_norm_bias
        # The output projection; may be stored narrower than the compute dtype (see DenseLinear).
        self._logits = DenseLinear(lm_head, None, embedding.dtype, scratch, fp16_gemm)
        self.rotary = RotaryEmbedding(options.rotary_dim, config.rotary_base, config.rope_scaling)
        self.long_rotary = None if options.long_rope is None else LongRopeEmbedding(options.rotary_dim, config.rotary_base, options.long_rope)
        self.scale = options.attention_scale

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
        long_rope = self.options.long_rope
        threshold = None if long_rope is None else long_rope.original_max_position_embeddings
        return KVCacheLayout(config.num_layers, config.num_kv_heads, config.head_size, self.kv_cache_dtype, threshold)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def lora_shape(self) -> ModelLoraShape:
        """LoRA modules on attention always; on the MLP unless it is a mixture of experts (TensorRT-LLM's expert modules,
        moe_h_to_4h / moe_4h_to_h / moe_gate, are not run here)."""
        config = self.config
        return ModelLoraShape(
            config.num_layers,
            config.hidden_size,
            config.q_size,
            config.kv_size,
            None if self.options.moe else config.intermediate_size,
            gated_mlp=self.options.ungated_activation is None,
            fused_gate_up=architecture_for_checkpoint(config.architecture).lora_fused_gate_up,
        )

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, dtype: torch.dtype = torch.float32, fp16_gemm: bool = False) -> LlamaModel:
        """`fp16_gemm`: dense Linears holding fp16 values run on fbgemm's fp16-weight GEMM (see `DenseLinear`)."""
        config = checkpoint.config
        options = DecoderOptions.from_config(checkpoint.raw_config, config)
        check_quantization(config.quantization)
        store = checkpoint.tensors
        embedding, lm_head = load_embeddings(store, config, dtype)
        scratch = WeightScratch()  # shared by the model's Linears whose weights are kept narrower
        layers = [
            _load_layer(
                store,
                config,
                index,
                dtype,
                scratch,
                fp16_gemm,
                options.qk_layernorm,
                options.layer_norm,
                gated_mlp=options.ungated_activation is None,
                fc_factor=2 if options.ungated_activation in DOUBLE_WIDTH_ACTIVATIONS else 1,
                moe=options.moe,
            )
            for index in range(config.num_layers)
        ]
        final_norm = store.get("transformer.ln_f.weight", (config.hidden_size,))
        final_bias = _norm_bias(store, "transformer.ln_f", config.hidden_size, dtype, options.layer_norm)
        return cls(config, embedding, layers, final_norm.to(dtype), lm_head, scratch, fp16_gemm, options, final_bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        kv_caches: list[torch.Tensor],
        metadata: AttentionMetadata,
        last_token_of: Sequence[int] | None = None,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:
        """Final hidden states of a flat token batch: [num_tokens, hidden], or, with
        `last_token_of` (sequence indices), only the last token of each of those sequences,
        [len(last_token_of), hidden]. `lora`: the rows' adapters (each Linear's output gets its rows' updates).

        With `last_token_of`, the last layer still writes every token's K/V (later steps read
        them) but runs its attention, output projection, MLP and the final norm only for the rows
        returned: nothing reads the other rows' outputs (a prompt's earlier tokens are never
        sampled from). This skips about a quarter of a prompt's compute.
        """
        config, options = self.config, self.options
        eps, num_heads, head_size = config.norm_epsilon, config.num_heads, config.head_size
        qk_size, rotary_dim, residual_multiplier = config.q_size + config.kv_size, options.rotary_dim, options.residual_multiplier
        hidden = F.embedding(input_ids, self.embedding)
        if options.embedding_multiplier != 1.0:
            hidden = hidden * options.embedding_multiplier
        cos, sin = self._cos_sin(metadata)
        num_tokens = input_ids.shape[0]
        last = len(self.layers) - 1
        # Nothing to prune when every row is already the one token of a sequence asked for.
        prune_to = last_token_of if last_token_of is not None and list(last_token_of) != list(range(num_tokens)) else None
        for index, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            qkv = linear_with_lora(layer.qkv, self._norm(hidden, layer.input_norm, layer.input_norm_bias), lora, index, Site.QKV)
            query_key = qkv[:, :qk_size].reshape(num_tokens, -1, head_size)
            if layer.q_norm is not None and layer.k_norm is not None:  # Qwen3: RMSNorm over each head, before RoPE
                query_key = torch.cat((rms_norm(query_key[:, :num_heads], layer.q_norm, eps), rms_norm(query_key[:, num_heads:], layer.k_norm, eps)), dim=1)
            # RoPE on query and key heads together: one elementwise pass instead of two.
            query_key = rotate_partial(query_key, cos, sin, rotary_dim)
            query, key = query_key[:, :num_heads], query_key[:, num_heads:]
            value = qkv[:, qk_size:].reshape(num_tokens, config.num_kv_heads, head_size)
            write_kv_cache(kv_cache, key, value, metadata.slot_mapping, layer.kv_quant)
            if index == last and prune_to is not None:
                rows, kept = metadata.last_tokens(prune_to)
                query, hidden, num_tokens = query[rows], hidden[rows], len(rows)
                lora = lora.select(rows) if lora is not None else None
                attention = paged_attention(query, kv_cache, kept, self.scale, layer.kv_quant)
            else:
                attention = paged_attention(query, kv_cache, metadata, self.scale, layer.kv_quant, key, value)
            attention = linear_with_lora(layer.dense, attention.reshape(num_tokens, config.q_size), lora, index, Site.DENSE)
            # residual + f(x), added in place into f's fresh output (addition commutes exactly)
            hidden = _scaled(attention, residual_multiplier).add_(hidden)
            normed = self._norm(hidden, layer.post_norm, layer.post_norm_bias)
            mlp = layer.moe(normed) if layer.moe is not None else self._mlp(layer, normed, lora, index)
            hidden = _scaled(mlp, residual_multiplier).add_(hidden)
        return self._norm(hidden, self.final_norm, self.final_norm_bias)

    def _norm(self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """RMSNorm, or the GPT class's LayerNorm (with its bias when the checkpoint has one)."""
        if self.options.layer_norm:
            return layer_norm(hidden, weight, bias, self.config.norm_epsilon)
        return rms_norm(hidden, weight, self.config.norm_epsilon)

    def _mlp(self, layer: DecoderLayer, normed: torch.Tensor, lora: LoraBatch | None, index: int) -> torch.Tensor:
        """proj of SwiGLU(fc, gate), or of a plain MLP's act(fc(x)); with the rows' LoRA updates."""
        ungated = self.options.ungated_activation if layer.gate is None else None  # a plain MLP's act(fc(x))
        fc = loaded(layer.fc, "mlp.fc", index)
        outputs = (fc(normed),) if ungated is not None else (fc(normed), loaded(layer.gate, "mlp.gate", index)(normed))
        if lora is not None:
            lora.add(index, Site.MLP_IN, normed, outputs)
        inner = UNGATED_ACTIVATIONS[ungated](outputs[0]) if ungated is not None else swiglu(*outputs)
        return linear_with_lora(loaded(layer.proj, "mlp.proj", index), inner, lora, index, Site.PROJ)

    def _cos_sin(self, metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """cos / sin [num_tokens, 1, rotary_dim] in the compute dtype: broadcast over heads and cast once per step,
        not per layer and per q / k. Long-RoPE picks each sequence's table by its length (`_long_rope_rows`)."""
        if self.long_rotary is None:
            cos, sin = self.rotary.cos_sin(metadata.positions)
        else:
            cos, sin = self.long_rotary.cos_sin(metadata.positions, self._long_rope_rows(metadata))
        return cos.unsqueeze(1).to(self.dtype), sin.unsqueeze(1).to(self.dtype)

    def _long_rope_rows(self, metadata: AttentionMetadata) -> torch.Tensor:
        """bool [num_tokens]: the rows of sequences longer than original_max_position_embeddings, which use the long
        factors. As TensorRT-LLM decides (its attention plugin compares the context length, i.e. the prompt), a
        sequence is long when its prompt is: the choice holds for the request's whole life, so chunked prefill, prefix
        reuse and every decode step rotate its keys alike. Without the prompt length (metadata built by hand), the
        tokens in the cache after this step decide, as transformers does per forward call."""
        original = self.options.long_rope.original_max_position_embeddings if self.options.long_rope else 0
        lengths = metadata.prompt_lens or metadata.context_lengths()
        starts = metadata.query_starts()
        flags = torch.tensor([length > original for length in lengths], dtype=torch.bool)
        counts = torch.tensor([end - begin for begin, end in zip(starts, starts[1:])], dtype=torch.int64)
        return flags.repeat_interleave(counts)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self._logits(hidden).to(torch.float32)
        scale = self.options.output_multiplier_scale
        return logits if scale == 1.0 else logits.mul_(scale)  # Granite: 1 / logits_scaling


def loaded(part: T | None, name: str, index: int) -> T:
    """A part of layer `index` that its model always loads (None only where another part replaces it: an MoE layer's
    dense MLP, an ungated MLP's gate, the norms of an option that is off)."""
    if part is None:
        raise RuntimeError(f"layer {index} has no {name}")
    return part


def linear_with_lora(linear: Linear, x: torch.Tensor, lora: LoraBatch | None, index: int, site: Site) -> torch.Tensor:
    """linear(x), plus the rows' LoRA updates of `site` in layer `index`."""
    output = linear(x)
    if lora is not None:
        lora.add(index, site, x, (output,))
    return output


def _scaled(output: torch.Tensor, multiplier: float) -> torch.Tensor:
    """A block's fresh output times Granite's residual multiplier (in place; untouched at 1.0)."""
    return output if multiplier == 1.0 else output.mul_(multiplier)


def load_embeddings(store: TensorStore, config: ModelConfig, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The vocab embedding in the compute dtype and the output projection (the embedding table when tied: no
    lm_head.weight; else kept as stored when that widens exactly, see DenseLinear)."""
    table_shape = (config.vocab_size, config.hidden_size)
    embedding = store.get("transformer.vocab_embedding.weight", table_shape).to(dtype)
    lm_head = store.get_optional("lm_head.weight", table_shape)
    return embedding, embedding if lm_head is None else weight_storage(lm_head, dtype)


def _load_layer(
    store: TensorStore,
    config: ModelConfig,
    index: int,
    dtype: torch.dtype,
    scratch: WeightScratch | None = None,
    fp16_gemm: bool = False,
    qk_layernorm: bool = False,
    layer_norm: bool = False,
    *,
    gated_mlp: bool = True,
    fc_factor: int = 1,
    moe: MoeSpec | None = None,
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
        fc=None if moe else linear("mlp.fc", hidden, fc_factor * inner, config.mlp_bias_required),
        gate=linear("mlp.gate", hidden, inner, config.mlp_bias_required) if gated_mlp and not moe else None,
        proj=None if moe else linear("mlp.proj", inner, hidden, config.mlp_bias_required),
        moe=None if moe is None else load_moe(store, config, moe, f"{prefix}.mlp", dtype, scratch, fp16_gemm),
        kv_quant=load_kv_cache_quantizer(store, f"{prefix}.attention", config.kv_cache_quant_algo),
        q_norm=store.get(f"{prefix}.attention.q_layernorm.weight", (config.head_size,)).to(dtype) if qk_layernorm else None,
        k_norm=store.get(f"{prefix}.attention.k_layernorm.weight", (config.head_size,)).to(dtype) if qk_layernorm else None,
        input_norm_bias=_norm_bias(store, f"{prefix}.input_layernorm", hidden, dtype, layer_norm),
        post_norm_bias=_norm_bias(store, f"{prefix}.post_layernorm", hidden, dtype, layer_norm),
    )


def _norm_bias(store: TensorStore, prefix: str, hidden: int, dtype: torch.dtype, layer_norm: bool) -> torch.Tensor | None:
    """A LayerNorm's bias when the checkpoint has one (RMSNorm has none)."""
    bias = store.get_optional(f"{prefix}.bias", (hidden,)) if layer_norm else None
    return None if bias is None else bias.to(dtype)
