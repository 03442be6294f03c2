"""Executing steps: a decoder model (one class per architecture) over a paged KV cache, and sampling."""

from refengine.model_runner.attention import AttentionMetadata, build_attention_metadata, paged_attention
from refengine.model_runner.decoder import DecoderModel, KVCacheLayout, load_model
from refengine.model_runner.llama import LlamaModel
from refengine.model_runner.runner import ModelRunner, torch_dtype
from refengine.model_runner.sampler import Sampler

__all__ = [
    "AttentionMetadata",
    "DecoderModel",
    "KVCacheLayout",
    "LlamaModel",
    "ModelRunner",
    "Sampler",
    "build_attention_metadata",
    "load_model",
    "paged_attention",
    "torch_dtype",
]
