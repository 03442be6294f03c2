"""Executing steps: the Llama-family model over a paged KV cache, and sampling."""

from refengine.model_runner.attention import AttentionMetadata, build_attention_metadata, paged_attention
from refengine.model_runner.model import LlamaModel
from refengine.model_runner.runner import ModelRunner, torch_dtype
from refengine.model_runner.sampler import Sampler

__all__ = [
    "AttentionMetadata",
    "LlamaModel",
    "ModelRunner",
    "Sampler",
    "build_attention_metadata",
    "paged_attention",
    "torch_dtype",
]
