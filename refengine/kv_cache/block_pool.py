"""A pool of fixed-size KV-cache blocks: reference counts, an eviction-ordered free queue and a
hash → block map for reusing computed prefixes.

A block with reference count 0 is free. If it still holds a registered hash it can be revived
(`touch`) by a request with the same prefix until it is handed out again (`allocate`), which
evicts the oldest free block first and forgets its hash.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class KVBlock:
    """One block of `tokens_per_block` KV slots. Owned and mutated by `BlockPool` only."""

    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None
    num_filled_slots: int = 0


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self._blocks = [KVBlock(block_id) for block_id in range(num_blocks)]
        # Free blocks, least recently freed first: the head is evicted first.
        self._free_queue: OrderedDict[int, None] = OrderedDict((b.block_id, None) for b in self._blocks)
        self._cached_block_ids: dict[bytes, int] = {}
        self._num_allocations = 0

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached_block_ids)

    def block(self, block_id: int) -> KVBlock:
        return self._blocks[block_id]

    def blocks(self) -> list[KVBlock]:
        return list(self._blocks)

    def free_block_ids(self) -> list[int]:
        """Free blocks in eviction order (first is evicted first)."""
        return list(self._free_queue)

    @property
    def num_allocations(self) -> int:
        """Blocks handed out by `allocate` since the pool was made (a running count)."""
        return self._num_allocations

    def allocate(self) -> KVBlock | None:
        """Hand out the oldest free block (forgetting any cached hash), or None if none is free."""
        if not self._free_queue:
            return None
        block_id, _ = self._free_queue.popitem(last=False)
        block = self._blocks[block_id]
        if block.block_hash is not None:
            if self._cached_block_ids.get(block.block_hash) == block_id:
                del self._cached_block_ids[block.block_hash]
            block.block_hash = None
        block.ref_count = 1
        block.num_filled_slots = 0
        self._num_allocations += 1
        return block

    def touch(self, block: KVBlock) -> None:
        """Take one more reference to a block (reviving it from the free queue if needed)."""
        if block.ref_count == 0:
            del self._free_queue[block.block_id]
        block.ref_count += 1

    def release(self, block: KVBlock) -> None:
        """Drop one reference; a block reaching 0 joins the tail of the free queue."""
        if block.ref_count <= 0:
            raise RuntimeError(f"block {block.block_id} released more often than referenced")
        block.ref_count -= 1
        if block.ref_count == 0:
            self._free_queue[block.block_id] = None

    def forget_hash(self, block: KVBlock) -> None:
        """Stop offering a block as a cached prefix (its slots are about to be rewritten)."""
        if block.block_hash is not None and self._cached_block_ids.get(block.block_hash) == block.block_id:
            del self._cached_block_ids[block.block_hash]
        block.block_hash = None

    def lookup(self, block_hash: bytes) -> KVBlock | None:
        block_id = self._cached_block_ids.get(block_hash)
        return None if block_id is None else self._blocks[block_id]

    def register(self, block: KVBlock, block_hash: bytes) -> None:
        """Remember a full, computed block under its prefix hash (first registration wins)."""
        if block.block_hash is not None:
            return
        if block_hash in self._cached_block_ids:
            return
        block.block_hash = block_hash
        self._cached_block_ids[block_hash] = block.block_id
