"""Stop/bad word lists in TensorRT-LLM's `[2, L]` layout, both directions.

Row 0 holds the token ids of every word, concatenated; row 1 holds the exclusive end offset of
each word in row 0, then -1 padding. Row 0 is padded with 0. An empty list is `[[0], [-1]]`.

    words [[5, 6], [7]]  ->  [[5, 6, 7],
                              [2, 3, -1]]

Needs numpy only, so it is importable outside Triton (tests).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PAD_ID = 0
PAD_OFFSET = -1


class WordListError(ValueError):
    """A `[2, L]` word list that does not follow the layout."""


def to_word_list(words: Sequence[Sequence[int]], width: int | None = None) -> np.ndarray:
    """One request's words as an INT32 `[2, width]` array (`width` ≥ the natural width)."""
    flat: list[int] = []
    offsets: list[int] = []
    for word in words:
        flat.extend(int(token_id) for token_id in word)
        offsets.append(len(flat))
    natural = max(1, len(flat), len(offsets))
    width = natural if width is None else width
    if width < natural:
        raise WordListError(f"width {width} is smaller than the {natural} columns the words need")
    array = np.full((2, width), PAD_ID, dtype=np.int32)
    array[1, :] = PAD_OFFSET
    array[0, : len(flat)] = flat
    array[1, : len(offsets)] = offsets
    return array


def to_word_list_batch(batch: Sequence[Sequence[Sequence[int]]]) -> np.ndarray:
    """Several requests' words as one INT32 `[B, 2, L]` array with a common width."""
    widths = [to_word_list(words).shape[1] for words in batch]
    width = max(widths, default=1)
    return np.stack([to_word_list(words, width) for words in batch]) if batch else np.zeros((0, 2, 1), np.int32)


def from_word_list(array: np.ndarray, name: str = "word list") -> tuple[tuple[int, ...], ...]:
    """The words of one `[2, L]` array; raises `WordListError` naming `name` if malformed."""
    if array.ndim != 2 or array.shape[0] != 2:
        raise WordListError(f"{name} must have shape [2, L], got {list(array.shape)}")
    ids = [int(value) for value in array[0]]
    words: list[tuple[int, ...]] = []
    start = 0
    for offset in (int(value) for value in array[1]):
        if offset < 0:
            break
        if offset <= start or offset > len(ids):
            raise WordListError(f"{name}: offset {offset} must be greater than the previous offset {start} and at most the row length {len(ids)}")
        word = tuple(ids[start:offset])
        if any(token_id < 0 for token_id in word):
            raise WordListError(f"{name}: negative token id in word {list(word)}")
        words.append(word)
        start = offset
    return tuple(words)
