"""UTF-8-safe incremental detokenization, shared by postprocessing and the BLS model.

A streamed response carries only the tokens generated since the previous one. Decoding those
tokens on their own loses information at the seam: a byte-level BPE token may hold half of a
multi-byte character, and SentencePiece decoders strip the leading space of the first token they
see. So every delta is computed with the tokens that precede it as context:

    text(new) = decode(preceding + new) minus decode(preceding)

and text that ends in U+FFFD (an incomplete UTF-8 sequence) is held back; the next delta, whose
context then contains the held-back tokens, emits it once the character is complete. The
concatenated deltas equal the text of the whole sequence, except that an incomplete character
at the very end of a generation (a cut-off, not text) is never emitted.

This module needs only the standard library, so it is importable outside Triton (tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT_CHARACTER = "\ufffd"

# Enough context for the longest UTF-8 sequence (4 bytes, possibly one token per byte) plus the
# tokens a SentencePiece decoder needs to keep a leading space.
CONTEXT_TOKENS = 8

Decode = Callable[[Sequence[int]], str]
DecodeBatch = Callable[[Sequence[Sequence[int]]], list[str]]
# (preceding ids, new ids); preceding None: the new ids are decoded on their own (no context travelled with them)
Piece = tuple[Sequence[int] | None, Sequence[int]]


def without_incomplete_tail(text: str) -> str:
    """`text` minus the U+FFFD run an unfinished multi-byte character decodes to."""
    return text.rstrip(REPLACEMENT_CHARACTER)


def text_delta(decode: Decode, preceding_ids: Sequence[int], new_ids: Sequence[int]) -> str:
    """The text `new_ids` add after `preceding_ids`, holding back an unfinished character."""
    return text_deltas(lambda sequences: [decode(ids) for ids in sequences], [(preceding_ids, new_ids)])[0]


def text_deltas(decode_batch: DecodeBatch, pieces: Sequence[Piece]) -> list[str]:
    """`text_delta` of every piece, decoded by one `decode_batch` call (every context and every context plus its
    new tokens); a piece without context is its new tokens' text as they decode alone. A decoder that rewrote
    earlier text (e.g. clean-up of spaces before punctuation) costs a second call for those pieces: their new
    tokens alone, rather than a wrong prefix."""
    sequences: list[list[int]] = []
    for preceding, new in pieces:
        if new:
            sequences += [list(new)] if preceding is None else [list(preceding), list(preceding) + list(new)]
    texts = iter(decode_batch(sequences) if sequences else [])
    deltas: list[str] = []
    rewritten: list[int] = []
    for index, (preceding, new) in enumerate(pieces):
        if not new:
            deltas.append("")
        elif preceding is None:
            deltas.append(next(texts))
        else:
            emitted_before, complete_now = without_incomplete_tail(next(texts)), without_incomplete_tail(next(texts))
            if complete_now.startswith(emitted_before):
                deltas.append(complete_now[len(emitted_before) :])
            else:
                deltas.append("")
                rewritten.append(index)
    if rewritten:
        for index, text in zip(rewritten, decode_batch([list(pieces[index][1]) for index in rewritten])):
            deltas[index] = without_incomplete_tail(text)
    return deltas


class IncrementalDetokenizer:
    """Per-request state: every token so far; `push` returns the text the new tokens complete."""

    def __init__(self, decode: Decode, prompt_ids: Sequence[int] = ()) -> None:
        self._decode = decode
        self._token_ids: list[int] = list(prompt_ids)[-CONTEXT_TOKENS:]
        self._num_context = len(self._token_ids)
        self._text_parts: list[str] = []

    @property
    def output_ids(self) -> list[int]:
        """The generated token ids pushed so far (the prompt context excluded)."""
        return self._token_ids[self._num_context :]

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._text_parts)

    def preceding_ids(self) -> list[int]:
        """The context the next delta is decoded against."""
        return self._token_ids[-CONTEXT_TOKENS:]

    def push(self, new_ids: Sequence[int]) -> str:
        delta = text_delta(self._decode, self.preceding_ids(), new_ids)
        self._token_ids.extend(int(token_id) for token_id in new_ids)
        self._text_parts.append(delta)
        return delta
