"""Held-out code prompts: the start of each function in `data/heldout/stdlib_heldout.txt`.

Those files were left out of training of the default model and of its draft (the split of
scripts/train_default_model.py), so acceptance is measured on code neither model saw.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

HELDOUT_TEXT = Path(__file__).resolve().parents[2] / "data" / "heldout" / "stdlib_heldout.txt"


def heldout_code_prompts(
    encode: Callable[[str], Sequence[int]], bos_id: int | None, count: int, prompt_tokens: int, text_path: Path = HELDOUT_TEXT
) -> list[list[int]]:
    """`count` prompts of `prompt_tokens` tokens, each ending inside a `def` line's body start,
    spread over the held-out text (every k-th function)."""
    text = text_path.read_text(encoding="utf-8")
    starts = [index for index in range(len(text)) if text.startswith("\ndef ", index) or text.startswith("\n    def ", index)]
    if not starts:
        raise ValueError(f"{text_path} has no function definitions")
    step = max(1, len(starts) // count)
    prompts = []
    for start in starts[::step][:count]:
        # A little context before the def, the def line and the start of its body.
        window = text[max(0, start - 200) : start + 400]
        ids = list(encode(window))
        cut = ids[: prompt_tokens - (1 if bos_id is not None else 0)]
        prompts.append(([bos_id] if bos_id is not None else []) + cut)
    return prompts
