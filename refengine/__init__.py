"""refengine: the project's CPU reference engine for TensorRT-LLM checkpoints.

It loads a TensorRT-LLM checkpoint or CPU engine directory (Llama family), and serves it with
inflight batching over a paged KV cache: a token-budget scheduler with chunked prefill, prefix
reuse and preemption, and a float32 model whose greedy output matches transformers.

    from refengine import LLMEngine, SamplingParams
    engine = LLMEngine.from_engine_dir("artifacts/.../engine")
    [out] = engine.generate([[1, 15043]], SamplingParams(max_tokens=8, temperature=0))

This package never imports `pipeline` or `clients`.
"""

from refengine.checkpoint import Checkpoint, EngineDirectory, load_checkpoint, load_engine_dir, write_engine_dir
from refengine.config import EngineConfig, SchedulerPolicy
from refengine.engine import LLMEngine
from refengine.engine_loop import EngineLoop, RequestStream
from refengine.errors import EngineConfigError, InvalidRequestError, ModelLoadError, RefEngineError
from refengine.kv_cache import KVCacheUsage
from refengine.model_config import ModelConfig
from refengine.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprob
from refengine.sampling import SamplingParams
from refengine.stats import EngineStats

__all__ = [
    "Checkpoint",
    "CompletionOutput",
    "EngineConfig",
    "EngineConfigError",
    "EngineDirectory",
    "EngineLoop",
    "EngineStats",
    "InvalidRequestError",
    "KVCacheUsage",
    "LLMEngine",
    "ModelConfig",
    "ModelLoadError",
    "RefEngineError",
    "RequestMetrics",
    "RequestOutput",
    "RequestStream",
    "SamplingParams",
    "SchedulerPolicy",
    "TokenLogprob",
    "load_checkpoint",
    "load_engine_dir",
    "write_engine_dir",
]
