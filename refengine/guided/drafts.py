"""Grammar masks for speculative draft positions.

A guided sequence that verifies k draft tokens needs the grammar's mask at every row the target
scores: row 0 is the sequence's own next position (`ScheduledSequence.allowed_tokens`), row j
the position after drafts d_1..d_j. The drafts are accepted into the grammar in order, the mask
after each recorded; the first draft the grammar refuses ends the draft there (the target could
not accept it: its masked row gives it no probability, and no mask exists past it), and so does
a stop token (nothing follows it; a drafted stop token would leave the next row without any
allowed token). Then every accepted draft is rolled back: the sequence's state stays at its
output, and verification's kept tokens are accepted like any sampled token (`Sequence.append_sample`).
This is NVIDIA's order in the PyTorch backend's `GuidedDecoder._build` (accept each draft token,
break on refusal or termination, fill the bitmask per position; roll back after verification).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from refengine.guided.state import GrammarState


def constrain_draft(grammar: GrammarState, draft_token_ids: Sequence[int]) -> tuple[int, torch.Tensor | None]:
    """(how many leading drafts the grammar allows, their masks [that many, vocab]: row j the
    tokens allowed after drafts 0..j); the grammar is left where it was."""
    masks = []
    for token_id in draft_token_ids:
        if grammar.is_stop_token(token_id) or not grammar.accept(token_id):
            break
        masks.append(grammar.allowed_next())
    grammar.rollback(len(masks))
    return len(masks), torch.stack(masks) if masks else None
