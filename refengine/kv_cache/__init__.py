"""Paged KV-cache bookkeeping: a block pool behind a narrow manager (no tensors here)."""

from refengine.kv_cache.block_pool import BlockPool, KVBlock
from refengine.kv_cache.manager import CachedPrefix, KVCacheManager, KVCacheUsage

__all__ = ["BlockPool", "CachedPrefix", "KVBlock", "KVCacheManager", "KVCacheUsage"]
