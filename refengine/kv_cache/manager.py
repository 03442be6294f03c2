"""The narrow facade the scheduler uses to place sequences in the KV cache.

Per sequence it owns a block table (the blocks holding its tokens' K/V, in order) and the number
of tokens that have a slot. Allocation either succeeds completely or changes nothing and
returns None: deciding what to do then (wait, preempt) is the scheduler's job.

Copy-on-write: `fork` shares every block of a sequence with a new one. When a sequence must
write into a shared, partly filled last block, it gets a private copy; the (source, destination)
pair is queued for the model runner, which copies the K/V before the step's forward pass
(`take_block_copies`).

Blocks given, per owner (TensorRT-LLM's per-request perf metrics): an `allocate_slots` call that
names an `owner` (the scheduler passes the request id) adds the blocks the pool handed out for it
(copy-on-write copies included) and the prefix-cache blocks a fresh sequence started with, until
`pop_blocks_given`. A recomputed (preempted) sequence counts what it is given again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from refengine.kv_cache.block_pool import BlockPool, KVBlock
from refengine.kv_cache.prefix_hash import hash_full_blocks


@dataclass(frozen=True)
class CachedPrefix:
    """Computed full blocks matching the start of a prompt (from `find_cached_prefix`)."""

    blocks: tuple[KVBlock, ...] = ()
    block_hashes: tuple[bytes, ...] = ()
    num_tokens: int = 0


@dataclass
class _SequenceSlots:
    blocks: list[KVBlock] = field(default_factory=list)
    num_slotted_tokens: int = 0
    block_hashes: list[bytes] = field(default_factory=list)


@dataclass(frozen=True)
class KVCacheUsage:
    num_blocks: int
    num_used_blocks: int
    num_free_blocks: int
    num_cached_blocks: int
    num_live_tokens: int
    tokens_per_block: int

    @property
    def fraction_used(self) -> float:
        return self.num_used_blocks / self.num_blocks


class KVCacheManager:
    def __init__(self, num_blocks: int, tokens_per_block: int, enable_prefix_caching: bool = False) -> None:
        self._pool = BlockPool(num_blocks)
        self._tokens_per_block = tokens_per_block
        self._enable_prefix_caching = enable_prefix_caching
        self._sequences: dict[int, _SequenceSlots] = {}
        self._pending_copies: list[tuple[int, int]] = []
        self._given: dict[str, list[int]] = {}  # owner -> [new blocks, reused prefix-cache blocks]

    # -- figures ---------------------------------------------------------------------------
    @property
    def tokens_per_block(self) -> int:
        return self._tokens_per_block

    @property
    def num_blocks(self) -> int:
        return self._pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self._pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self._pool.num_used_blocks

    @property
    def pool(self) -> BlockPool:
        """The underlying pool, for inspection (tests, metrics)."""
        return self._pool

    def usage(self) -> KVCacheUsage:
        live_tokens = sum(b.num_filled_slots for b in self._pool.blocks() if b.ref_count > 0)
        return KVCacheUsage(
            num_blocks=self._pool.num_blocks,
            num_used_blocks=self._pool.num_used_blocks,
            num_free_blocks=self._pool.num_free_blocks,
            num_cached_blocks=self._pool.num_cached_blocks,
            num_live_tokens=live_tokens,
            tokens_per_block=self._tokens_per_block,
        )

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self._tokens_per_block)

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        slots = self._sequences.get(seq_id)
        return () if slots is None else tuple(b.block_id for b in slots.blocks)

    def num_slotted_tokens(self, seq_id: int) -> int:
        slots = self._sequences.get(seq_id)
        return 0 if slots is None else slots.num_slotted_tokens

    def has_sequence(self, seq_id: int) -> bool:
        return seq_id in self._sequences

    def shares_last_partial_block(self, seq_id: int) -> bool:
        """Whether the sequence's next token lands in a block shared with another sequence."""
        slots = self._sequences.get(seq_id)
        return slots is not None and self._needs_copy_on_write(slots, slots.num_slotted_tokens + 1)

    # -- prefix reuse ----------------------------------------------------------------------
    def find_cached_prefix(self, token_ids: Sequence[int], salt: bytes = b"") -> CachedPrefix:
        """The longest run of computed full blocks equal to the start of `token_ids` (registered with the same `salt`).

        At least one token is left out, so the sequence still computes the logits it samples from.
        """
        if not self._enable_prefix_caching or len(token_ids) <= 1:
            return CachedPrefix()
        max_blocks = (len(token_ids) - 1) // self._tokens_per_block
        blocks: list[KVBlock] = []
        hashes: list[bytes] = []
        for block_hash in hash_full_blocks(token_ids, self._tokens_per_block, max_blocks, salt=salt):
            block = self._pool.lookup(block_hash)
            if block is None:
                break
            blocks.append(block)
            hashes.append(block_hash)
        return CachedPrefix(tuple(blocks), tuple(hashes), len(blocks) * self._tokens_per_block)

    def cache_computed_blocks(self, seq_id: int, token_ids: Sequence[int], num_computed_tokens: int, salt: bytes = b"") -> None:
        """Register the sequence's full blocks whose K/V are computed, for later prefix reuse."""
        slots = self._sequences.get(seq_id)
        if not self._enable_prefix_caching or slots is None:
            return
        num_full = min(num_computed_tokens // self._tokens_per_block, len(slots.blocks))
        if num_full <= len(slots.block_hashes):
            return
        slots.block_hashes = hash_full_blocks(token_ids, self._tokens_per_block, num_full, slots.block_hashes, salt)
        for block, block_hash in zip(slots.blocks, slots.block_hashes):
            self._pool.register(block, block_hash)

    # -- allocation ------------------------------------------------------------------------
    def blocks_needed(self, seq_id: int, num_total_tokens: int, cached_prefix: CachedPrefix | None = None) -> int:
        """Free blocks that `allocate_slots(seq_id, num_total_tokens, cached_prefix)` would consume."""
        slots = self._sequences.get(seq_id)
        if slots is None:
            prefix = cached_prefix or CachedPrefix()
            revived = sum(1 for b in prefix.blocks if b.ref_count == 0)
            return revived + max(0, self.blocks_for_tokens(num_total_tokens) - len(prefix.blocks))
        needed = max(0, self.blocks_for_tokens(num_total_tokens) - len(slots.blocks))
        if self._needs_copy_on_write(slots, num_total_tokens):
            needed += 1
        return needed

    def can_allocate(self, seq_id: int, num_total_tokens: int, cached_prefix: CachedPrefix | None = None) -> bool:
        return self.blocks_needed(seq_id, num_total_tokens, cached_prefix) <= self._pool.num_free_blocks

    def allocate_slots(
        self, seq_id: int, num_total_tokens: int, cached_prefix: CachedPrefix | None = None, *, owner: str | None = None
    ) -> tuple[int, ...] | None:
        """Give the sequence slots for its first `num_total_tokens` tokens.

        `cached_prefix` (from `find_cached_prefix`) is used only for a sequence without blocks.
        Returns the block table, or None — with nothing changed — if the blocks are not free.
        `owner`: whom the blocks count for (see `blocks_given`).
        """
        if not self.can_allocate(seq_id, num_total_tokens, cached_prefix):
            return None
        allocations = self._pool.num_allocations
        slots = self._sequences.get(seq_id)
        if owner is not None:
            given = self._given.setdefault(owner, [0, 0])
            given[1] += len(cached_prefix.blocks) if slots is None and cached_prefix is not None else 0
        if slots is None:
            slots = _SequenceSlots()
            self._sequences[seq_id] = slots
            if cached_prefix is not None and cached_prefix.blocks:
                for block in cached_prefix.blocks:
                    self._pool.touch(block)
                slots.blocks.extend(cached_prefix.blocks)
                slots.block_hashes.extend(cached_prefix.block_hashes)
                slots.num_slotted_tokens = cached_prefix.num_tokens
        if self._needs_copy_on_write(slots, num_total_tokens):
            self._copy_last_block(slots)
        while len(slots.blocks) < self.blocks_for_tokens(num_total_tokens):
            new_block = self._pool.allocate()
            if new_block is None:  # cannot happen after can_allocate; kept as a hard stop
                raise RuntimeError("block pool ran dry after can_allocate said yes")
            slots.blocks.append(new_block)
        slots.num_slotted_tokens = max(slots.num_slotted_tokens, num_total_tokens)
        self._update_filled_slots(slots)
        if owner is not None:
            self._given[owner][0] += self._pool.num_allocations - allocations
        return tuple(b.block_id for b in slots.blocks)

    def blocks_given(self, owner: str) -> tuple[int, int]:
        """(newly allocated, reused from the prefix cache) blocks given to `owner` so far."""
        new, reused = self._given.get(owner, (0, 0))
        return new, reused

    def pop_blocks_given(self, owner: str) -> tuple[int, int]:
        new, reused = self._given.pop(owner, (0, 0))
        return new, reused

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """Let `child_seq_id` share every block of `parent_seq_id` (copy-on-write later)."""
        parent = self._sequences.get(parent_seq_id)
        if parent is None:
            raise KeyError(f"sequence {parent_seq_id} holds no KV blocks")
        if child_seq_id in self._sequences:
            raise KeyError(f"sequence {child_seq_id} already holds KV blocks")
        for block in parent.blocks:
            self._pool.touch(block)
        self._sequences[child_seq_id] = _SequenceSlots(
            blocks=list(parent.blocks),
            num_slotted_tokens=parent.num_slotted_tokens,
            block_hashes=list(parent.block_hashes),
        )

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Keep slots for the sequence's first `num_tokens` tokens only (speculative decoding's
        rollback of rejected draft tokens): blocks past them are released, tail first.

        A kept block that loses slots stops being a cached prefix block (its later slots will be
        rewritten); a shared one keeps its filled slots for the other holders and is copied on
        the sequence's next write into it, as after `fork`. Cutting into a block that is both
        shared and a cached prefix block is refused: its holders could later leave it to this
        sequence alone, which would rewrite slots the cache still offers.
        """
        slots = self._sequences.get(seq_id)
        if slots is None or num_tokens >= slots.num_slotted_tokens:
            return
        num_kept = self.blocks_for_tokens(num_tokens)
        cut = slots.blocks[num_kept - 1] if num_tokens % self._tokens_per_block else None
        if cut is not None and cut.ref_count > 1 and cut.block_hash is not None:
            raise ValueError(f"sequence {seq_id}: cannot truncate to {num_tokens} tokens inside shared cached block {cut.block_id}")
        for block in reversed(slots.blocks[num_kept:]):
            self._pool.release(block)
        del slots.blocks[num_kept:]
        del slots.block_hashes[num_tokens // self._tokens_per_block :]
        slots.num_slotted_tokens = num_tokens
        partial = num_tokens % self._tokens_per_block
        if partial and slots.blocks[-1].ref_count == 1:
            self._pool.forget_hash(slots.blocks[-1])
            slots.blocks[-1].num_filled_slots = partial

    def reparent(self, assignments: Sequence[tuple[int, int]]) -> None:
        """Beam search: each (sequence, source) pair gives `sequence` the block table `source` had
        before the call (sharing its blocks, copy-on-write later), all at once. Every new reference
        is taken before an old one is dropped, so a block another assignment still reads is never
        freed in between."""
        snapshot = {}
        for _, source in assignments:
            slots = self._sequences.get(source)
            if slots is None:
                raise KeyError(f"sequence {source} holds no KV blocks")
            snapshot[source] = _SequenceSlots(list(slots.blocks), slots.num_slotted_tokens, list(slots.block_hashes))
        old = []
        for seq_id, source in assignments:
            copied = snapshot[source]
            for block in copied.blocks:
                self._pool.touch(block)
            old.append(self._sequences.get(seq_id))
            self._sequences[seq_id] = _SequenceSlots(list(copied.blocks), copied.num_slotted_tokens, list(copied.block_hashes))
        for slots in old:
            for block in reversed(slots.blocks if slots is not None else []):
                self._pool.release(block)

    def free(self, seq_id: int) -> None:
        """Release every block of the sequence (no-op for an unknown id)."""
        slots = self._sequences.pop(seq_id, None)
        if slots is None:
            return
        # Tail blocks first, so they are evicted before the (more shareable) prefix blocks.
        for block in reversed(slots.blocks):
            self._pool.release(block)

    def take_block_copies(self) -> list[tuple[int, int]]:
        """(source, destination) block copies the runner must perform before the next forward."""
        copies, self._pending_copies = self._pending_copies, []
        return copies

    # -- internals -------------------------------------------------------------------------
    def _needs_copy_on_write(self, slots: _SequenceSlots, num_total_tokens: int) -> bool:
        writes_into_last_block = slots.num_slotted_tokens % self._tokens_per_block != 0
        return num_total_tokens > slots.num_slotted_tokens and writes_into_last_block and bool(slots.blocks) and slots.blocks[-1].ref_count > 1

    def _copy_last_block(self, slots: _SequenceSlots) -> None:
        shared = slots.blocks[-1]
        private = self._pool.allocate()
        if private is None:
            raise RuntimeError("block pool ran dry during copy-on-write")
        private.num_filled_slots = shared.num_filled_slots
        self._pending_copies.append((shared.block_id, private.block_id))
        self._pool.release(shared)
        slots.blocks[-1] = private
        if len(slots.block_hashes) >= len(slots.blocks):
            del slots.block_hashes[len(slots.blocks) - 1 :]

    def _update_filled_slots(self, slots: _SequenceSlots) -> None:
        for index, block in enumerate(slots.blocks):
            filled = min(self._tokens_per_block, slots.num_slotted_tokens - index * self._tokens_per_block)
            block.num_filled_slots = max(block.num_filled_slots, filled)
