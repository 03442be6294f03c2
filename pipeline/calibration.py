"""Calibration data: local text / JSONL files → fixed-length token windows, and their fingerprint.

Importable with the standard library alone (plus `transformers` for `load_encoder`): the quantize job
(`pipeline.quantization.job`) runs it inside NVIDIA's image, where the spec's pydantic models
are not imported.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import SpecError

if TYPE_CHECKING:
    from pipeline.config.spec import AccuracyGateSpec, CalibrationSpec


@dataclass(frozen=True)
class CalibrationSet:
    files: tuple[Path, ...]
    windows: list[list[int]]  # num_samples × max_seq_len token ids
    tokens_available: int
    fingerprint: str  # SHA-256 of the token ids, in order

    def batches(self, batch_size: int) -> list[list[list[int]]]:
        return [self.windows[i : i + batch_size] for i in range(0, len(self.windows), batch_size)]

    def summary(self) -> dict[str, Any]:
        return {
            "files": [str(f) for f in self.files],
            "num_samples": len(self.windows),
            "tokens_per_sample": len(self.windows[0]) if self.windows else 0,
            "tokens_available": self.tokens_available,
            "token_ids_sha256": self.fingerprint,
        }


def calibration_files(spec: CalibrationSpec) -> tuple[Path, ...]:
    return _expand_all(spec.files)


def heldout_files(spec: AccuracyGateSpec) -> tuple[Path, ...]:
    return _expand_all(spec.heldout_files)


def _expand_all(patterns: Sequence[str]) -> tuple[Path, ...]:
    from pipeline.config.model_checks import expand_glob

    files: list[Path] = []
    for pattern in patterns:
        for path in expand_glob(pattern):
            if path not in files:
                files.append(path)
    return tuple(files)


def read_documents(path: Path) -> list[str]:
    """A .jsonl file gives one document per line (its "text" field); any other file is one document."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".jsonl":
        return [text]
    documents = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{path}:{number}: not a JSON line ({exc.msg})") from None
        value = record.get("text") if isinstance(record, dict) else record
        if not isinstance(value, str):
            raise SpecError(f'{path}:{number}: expected a string or an object with a "text" string')
        documents.append(value)
    return documents


def build_calibration_set(spec: CalibrationSpec, encode: Callable[[str], Sequence[int]], separator_id: int | None) -> CalibrationSet:
    """Tokenize every document, join them with `separator_id`, cut `max_seq_len` windows, pick `num_samples` by seed."""
    return calibration_windows(calibration_files(spec), encode, separator_id, max_seq_len=spec.max_seq_len, num_samples=spec.num_samples, seed=spec.seed)


def calibration_windows(
    files: Sequence[Path],
    encode: Callable[[str], Sequence[int]],
    separator_id: int | None,
    *,
    max_seq_len: int,
    num_samples: int,
    seed: int,
) -> CalibrationSet:
    """`build_calibration_set` for an already expanded file list (what a quantize job request carries)."""
    files = tuple(Path(f) for f in files)
    stream: list[int] = []
    for path in files:
        for document in read_documents(path):
            stream.extend(encode(document))
            if separator_id is not None:
                stream.append(separator_id)
    length = max_seq_len
    available = len(stream) // length
    if available == 0:
        raise SpecError(
            f"quantize.calibration: the calibration text has {len(stream)} tokens, fewer than one sample "
            f"(quantize.calibration.max_seq_len {length}); add text or lower max_seq_len"
        )
    chosen = sorted(random.Random(seed).sample(range(available), min(num_samples, available)))
    windows = [stream[i * length : (i + 1) * length] for i in chosen]
    digest = hashlib.sha256()
    for window in windows:
        digest.update(b"".join(token.to_bytes(4, "little", signed=True) for token in window))
    return CalibrationSet(files, windows, len(stream), digest.hexdigest())


def file_digests(files: Sequence[Path]) -> str:
    """Content digest of the calibration files, for the plan (tokenization happens in the stage)."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:32]


def load_tokenizer(tokenizer_dir: Path):
    """The transformers tokenizer of a model directory, offline, without a length limit."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    tokenizer.model_max_length = 1 << 40  # long documents are cut into windows here, not by the tokenizer
    return tokenizer


def load_encoder(tokenizer_dir: Path) -> tuple[Callable[[str], Sequence[int]], int | None]:
    """The tokenizer of a model directory as (encode without special tokens, eos id)."""
    tokenizer = load_tokenizer(tokenizer_dir)
    return (lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]), tokenizer.eos_token_id
