"""What the spec asks of trtllm-build, as one flat record: the input of `trtllm_rules.resolve` and of the renderers
in `trtllm_build`, which both import it from here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BuildRequest:
    """What the spec asks of trtllm-build, flat and TensorRT-LLM-agnostic; `resolve` returns the applied copy."""

    name: str
    architecture: str
    dtype: str
    quant_algo: str  # a quantize.algo value (a key of quant_formats.WEIGHT_FORMATS)
    kv_cache_quant: str  # a quantize.kv_cache value (a key of quant_formats.KV_CACHE_FORMATS)
    group_size: int
    tp_size: int
    pp_size: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int | None  # None: deduce from the model (model_max_seq_len)
    model_max_seq_len: int  # what trtllm-build deduces from the checkpoint (ModelInfo.default_max_seq_len)
    max_num_tokens: int
    opt_num_tokens: int | None
    max_beam_width: int
    tokens_per_block: int
    kv_cache_type: str  # paged, continuous, disabled
    gpt_attention_plugin: str
    gemm_plugin: str
    context_fmha: bool
    use_paged_context_fmha: bool
    use_fp8_context_fmha: bool
    use_fused_mlp: bool
    remove_input_padding: bool
    reduce_fusion: bool
    multiple_profiles: bool
    enable_kv_cache_reuse: bool  # serve.* switches that need paged context FMHA in the engine
    enable_chunked_context: bool
    gather_context_logits: bool = False
    # LoRA (--lora_plugin and the --lora_* flags): lora_plugin is a dtype or "disable"
    lora_plugin: str = "disable"
    lora_dirs: tuple[str, ...] = ()
    lora_ckpt_source: str = "hf"
    lora_target_modules: tuple[str, ...] = ()
    max_lora_rank: int = 64
    # speculative decoding: a --speculative_decoding_mode choice (None: off) and --max_draft_len
    speculative_decoding_mode: str | None = None
    max_draft_len: int = 0
    num_eagle_layers: int = 0  # an EAGLE engine's draft depth (its tree's), which trtllm-build also adds to max_seq_len

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size
