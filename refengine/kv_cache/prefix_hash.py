"""Chained content hashes of full KV blocks: equal hash ⇔ equal token prefix up to that block."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence


def hash_block(parent_hash: bytes | None, block_token_ids: Sequence[int], salt: bytes = b"") -> bytes:
    """`salt` (first block only) separates sequences whose K/V differ for the same tokens."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(parent_hash or b"root" + salt)
    digest.update(array("q", block_token_ids).tobytes())
    return digest.digest()


def hash_full_blocks(token_ids: Sequence[int], tokens_per_block: int, num_blocks: int, known: Sequence[bytes] = (), salt: bytes = b"") -> list[bytes]:
    """Hashes of the first `num_blocks` blocks of `token_ids`, extending the `known` ones."""
    hashes = list(known[:num_blocks])
    for index in range(len(hashes), num_blocks):
        start = index * tokens_per_block
        parent = hashes[-1] if hashes else None
        hashes.append(hash_block(parent, token_ids[start : start + tokens_per_block], salt))
    return hashes
