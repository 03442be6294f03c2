"""The xgrammar tokenizer-info file the `tensorrt_llm` model's guided decoding reads.

Written by the package stage from the model's tokenizer, in the format of TensorRT-LLM's
`examples/generate_xgrammar_tokenizer_info.py` (`tensorrt_llm.llmapi.tokenizer._xgrammar_tokenizer_info`
for a fast tokenizer): `encoded_vocab` (every token, by id), `tokenizer_str` (tokenizer.json) and
`stop_token_ids` ([eos]). The C++ backend reads it through `xgrammar_tokenizer_info_path`; the cpu
model reads the same file.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.errors import StageError

FILE_NAME = "xgrammar_tokenizer_info.json"


def write_tokenizer_info(tokenizer_dir: Path, eos_id: int | None, path: Path) -> Path:
    if eos_id is None:
        raise StageError(
            f"{tokenizer_dir}: the tokenizer has no eos_token; guided decoding ends a generation with it",
            hint="set eos_token in tokenizer_config.json, or serve.guided_decoding: none",
        )
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    encoded_vocab = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    document = {"encoded_vocab": encoded_vocab, "tokenizer_str": tokenizer.to_str(), "stop_token_ids": [eos_id]}
    path.write_text(json.dumps(document), encoding="utf-8")
    return path
