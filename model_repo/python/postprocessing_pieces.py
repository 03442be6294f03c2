"""What a postprocessing request asks to decode: its sequences as (preceding ids, new ids) pieces.

Inputs of one request: TOKENS_BATCH [B, beams, T] (or [B, T]), SEQUENCE_LENGTH [B, beams] and, from the cpu
`tensorrt_llm` model and the stand-in, PRECEDING_IDS [B, beams, K] (padding < 0). The pieces come row by row, beam
by beam: the order of OUTPUT (wire shape [beams] for one row, as NVIDIA's postprocessing). A request without
PRECEDING_IDS (TensorRT-LLM's C++ backend) decodes each response on its own, as upstream does.

A batched execution holds requests of different streams, streamed and not, beams and parallel samples side by
side: each request's pieces carry their own context, so no state is shared between them and one decode call
serves them all (incremental_detokenizer.text_deltas). numpy only: importable outside Triton (tests).
"""

from __future__ import annotations

import numpy as np
from incremental_detokenizer import Piece


class PostprocessingInputError(ValueError):
    """Inputs that do not have postprocessing's shapes; the message names the input."""


def request_pieces(tokens: np.ndarray, lengths: np.ndarray, preceding: np.ndarray | None) -> list[Piece]:
    tokens = _three_dimensional(tokens, "TOKENS_BATCH")
    rows, beams, width = tokens.shape
    if lengths.size == 0 or lengths.size % rows:
        raise PostprocessingInputError(f"SEQUENCE_LENGTH must hold a length per sequence of the {rows} row(s), got shape {list(lengths.shape)}")
    lengths = lengths.reshape(rows, -1)  # a beam without a length of its own is taken whole
    if preceding is not None:
        preceding = _three_dimensional(preceding, "PRECEDING_IDS")
        if preceding.shape[:2] != (rows, beams):
            raise PostprocessingInputError(f"PRECEDING_IDS must have shape [{rows}, {beams}, K] as TOKENS_BATCH, got {list(preceding.shape)}")
    pieces: list[Piece] = []
    for row in range(rows):
        for beam in range(beams):
            length = int(lengths[row, beam]) if beam < lengths.shape[1] else width
            new = tokens[row, beam, : max(0, min(length, width))].tolist()
            if preceding is None:
                pieces.append((None, new))
            else:
                context = preceding[row, beam]
                pieces.append((context[context >= 0].tolist(), new))
    return pieces


def _three_dimensional(array: np.ndarray, name: str) -> np.ndarray:
    """[B, beams, T] from the batched contract shape; a missing beam axis is added."""
    if array.ndim == 2:
        return array[:, np.newaxis, :]
    if array.ndim != 3:
        raise PostprocessingInputError(f"{name} must have shape [batch, beams, tokens], got {list(array.shape)}")
    return array
