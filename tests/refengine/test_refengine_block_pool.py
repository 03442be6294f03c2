"""Block pool / KV manager invariants under random allocate, append, fork, reparent (beam search),
preempt (free, then recompute), cache and free, in any order."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from refengine.kv_cache import KVCacheManager

BLOCK_SIZE = 4
NUM_BLOCKS = 12


class KVCacheMachine(RuleBasedStateMachine):
    sequences = Bundle("sequences")

    def __init__(self) -> None:
        super().__init__()
        self.kv = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True)
        self.tokens: dict[int, list[int]] = {}  # the token ids each live sequence holds
        self.next_id = 0
        # Model of the K/V contents: which token sits in each slot (copies applied as the runner does).
        self.slots: dict[int, int] = {}

    def _write(self, seq_id: int, start: int) -> None:
        for source, destination in self.kv.take_block_copies():
            for offset in range(BLOCK_SIZE):
                if source * BLOCK_SIZE + offset in self.slots:
                    self.slots[destination * BLOCK_SIZE + offset] = self.slots[source * BLOCK_SIZE + offset]
        table = self.kv.block_table(seq_id)
        tokens = self.tokens[seq_id]
        for position in range(start, len(tokens)):
            self.slots[table[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE] = tokens[position]

    @rule(target=sequences, tokens=st.lists(st.integers(0, 3), min_size=1, max_size=20), use_cache=st.booleans())
    def allocate(self, tokens, use_cache):
        seq_id = self.next_id
        prefix = self.kv.find_cached_prefix(tokens) if use_cache else None
        free_before = self.kv.num_free_blocks
        table = self.kv.allocate_slots(seq_id, len(tokens), prefix)
        if table is None:
            assert self.kv.num_free_blocks == free_before  # a refused allocation changes nothing
            assert not self.kv.has_sequence(seq_id)
            return None
        self.next_id += 1
        self.tokens[seq_id] = list(tokens)
        cached = prefix.num_tokens if prefix else 0
        self._write(seq_id, cached)
        self.kv.cache_computed_blocks(seq_id, tokens, len(tokens))
        return seq_id

    @rule(seq_id=sequences, extra=st.lists(st.integers(0, 3), min_size=1, max_size=6))
    def append(self, seq_id, extra):
        if seq_id is None or seq_id not in self.tokens:
            return
        start = len(self.tokens[seq_id])
        if self.kv.allocate_slots(seq_id, start + len(extra)) is None:
            return
        self.tokens[seq_id].extend(extra)
        self._write(seq_id, start)
        self.kv.cache_computed_blocks(seq_id, self.tokens[seq_id], len(self.tokens[seq_id]))

    @rule(seq_id=sequences, drafts=st.lists(st.integers(0, 3), min_size=1, max_size=6), data=st.data())
    def speculate_and_roll_back(self, seq_id, drafts, data):
        """Speculative decoding: slots for k draft tokens, their K/V written, then the rejected
        ones truncated away; the accepted ones stay part of the sequence."""
        if seq_id is None or seq_id not in self.tokens:
            return
        start = len(self.tokens[seq_id])
        if self.kv.allocate_slots(seq_id, start + len(drafts)) is None:
            return
        self.tokens[seq_id].extend(drafts)
        self._write(seq_id, start)
        accepted = data.draw(st.integers(0, len(drafts)))
        del self.tokens[seq_id][start + accepted :]
        self.kv.truncate(seq_id, start + accepted)
        assert self.kv.num_slotted_tokens(seq_id) == start + accepted
        self.kv.cache_computed_blocks(seq_id, self.tokens[seq_id], len(self.tokens[seq_id]))

    @rule(target=sequences, parent=sequences)
    def fork(self, parent):
        if parent is None or parent not in self.tokens:
            return None
        child = self.next_id
        self.next_id += 1
        self.kv.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])
        return child

    @rule(data=st.data())
    def reparent(self, data):
        """Beam search's step: each chosen sequence takes the table another one had before it."""
        live = sorted(self.tokens)
        if not live:
            return
        targets = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=len(live), unique=True))
        sources = [data.draw(st.sampled_from(live)) for _ in targets]
        before = {seq_id: list(tokens) for seq_id, tokens in self.tokens.items()}
        self.kv.reparent(list(zip(targets, sources)))
        for target, source in zip(targets, sources):
            self.tokens[target] = list(before[source])

    @rule(seq_id=sequences)
    def preempt(self, seq_id):
        """Preemption by recompute: the blocks go, later the whole sequence is written again."""
        if seq_id is None or seq_id not in self.tokens:
            return
        self.kv.free(seq_id)
        tokens = self.tokens.pop(seq_id)
        if self.kv.allocate_slots(seq_id, len(tokens)) is not None:
            self.tokens[seq_id] = tokens
            self._write(seq_id, 0)

    @rule(seq_id=consumes(sequences))
    def free(self, seq_id):
        if seq_id is None or seq_id not in self.tokens:
            return
        self.kv.free(seq_id)
        del self.tokens[seq_id]

    @rule()
    def free_unknown_is_noop(self):
        free_before = self.kv.num_free_blocks
        self.kv.free(10_000)
        assert self.kv.num_free_blocks == free_before

    @invariant()
    def blocks_are_conserved(self):
        pool = self.kv.pool
        assert pool.num_free_blocks + pool.num_used_blocks == NUM_BLOCKS
        assert len(set(pool.free_block_ids())) == pool.num_free_blocks

    @invariant()
    def reference_counts_match_block_tables(self):
        holders = Counter(block for seq_id in self.tokens for block in self.kv.block_table(seq_id))
        free = set(self.kv.pool.free_block_ids())
        for block in self.kv.pool.blocks():
            assert block.ref_count >= 0
            assert block.ref_count == holders[block.block_id]
            assert (block.ref_count == 0) == (block.block_id in free)

    @invariant()
    def every_sequence_reads_its_own_tokens(self):
        for seq_id, tokens in self.tokens.items():
            table = self.kv.block_table(seq_id)
            assert len(table) == -(-len(tokens) // BLOCK_SIZE)
            read = [self.slots[table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE] for p in range(len(tokens))]
            assert read == tokens

    @rule()
    def usage_figures_are_consistent(self):
        usage = self.kv.usage()
        assert usage.num_used_blocks + usage.num_free_blocks == usage.num_blocks
        assert 0 <= usage.num_live_tokens <= usage.num_used_blocks * BLOCK_SIZE

    def teardown(self):
        for seq_id in list(self.tokens):
            self.kv.free(seq_id)
        assert self.kv.num_free_blocks == NUM_BLOCKS
        assert all(block.ref_count == 0 for block in self.kv.pool.blocks())
        assert self.kv.usage().num_live_tokens == 0


TestKVCacheMachine = KVCacheMachine.TestCase
TestKVCacheMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_allocation_that_cannot_fit_returns_none():
    kv = KVCacheManager(num_blocks=2, tokens_per_block=4)
    assert kv.allocate_slots(0, 9) is None
    assert kv.num_free_blocks == 2
    assert kv.allocate_slots(0, 8) is not None
    assert not kv.can_allocate(1, 1)


def test_copy_on_write_of_shared_partial_block():
    kv = KVCacheManager(num_blocks=4, tokens_per_block=4)
    kv.allocate_slots(0, 6)  # blocks [a, b], b half full
    kv.fork(0, 1)
    assert kv.block_table(0) == kv.block_table(1)
    assert kv.allocate_slots(1, 7) is not None
    copies = kv.take_block_copies()
    assert copies == [(kv.block_table(0)[1], kv.block_table(1)[1])]
    assert kv.block_table(0)[0] == kv.block_table(1)[0]  # the full block stays shared
    assert kv.allocate_slots(0, 7) is not None  # now the sole owner: no copy
    assert kv.take_block_copies() == []


def test_prefix_blocks_are_reused_and_evicted_oldest_first():
    kv = KVCacheManager(num_blocks=4, tokens_per_block=2, enable_prefix_caching=True)
    prompt = [1, 2, 3, 4, 5]
    kv.allocate_slots(0, len(prompt))
    kv.cache_computed_blocks(0, prompt, len(prompt))
    kv.free(0)
    prefix = kv.find_cached_prefix(prompt)
    assert prefix.num_tokens == 4
    kv.allocate_slots(1, len(prompt), prefix)
    assert kv.block_table(1)[:2] == tuple(b.block_id for b in prefix.blocks)
    with pytest.raises(KeyError):
        kv.fork(99, 100)
