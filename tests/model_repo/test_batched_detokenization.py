"""Batched detokenization (issue #34): one tokenizer call per postprocessing execution gives every request the text
it got one at a time, UTF-8 safe at every cut, for streamed and non-streamed requests, beams and parallel samples
side by side. The pure parts of the shipped model code, outside Triton (tests/integration covers them served)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL_CODE = REPO / "model_repo" / "python"
TOKENIZER_DIR = REPO / "models" / "tiny-stdlib-llama"
TEXT = " héllo 你好 🎉 wörld, naïve café — 東京 ½ €"
MODULES = ("incremental_detokenizer", "postprocessing_pieces", "hf_tokenizer")


@pytest.fixture
def code(monkeypatch):
    monkeypatch.syspath_prepend(str(MODEL_CODE))
    yield
    for name in MODULES:
        sys.modules.pop(name, None)


@pytest.fixture
def tokenizer(code):
    from hf_tokenizer import HFTokenizer

    return HFTokenizer(TOKENIZER_DIR)


class CountingDecode:
    """The tokenizer's decode_batch, counting its calls."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.calls = tokenizer, 0

    def __call__(self, sequences):
        self.calls += 1
        return self.tokenizer.decode_batch(sequences)


def _streams(tokenizer, texts, chunk):
    """Each text's (context, new ids) pieces, as a stream of `chunk` tokens per response sends them."""
    from incremental_detokenizer import CONTEXT_TOKENS

    prompt = tokenizer.encode("# prompt")
    streams = []
    for text in texts:
        ids, pieces, history = tokenizer.encode(text, add_special_tokens=False), [], list(prompt)
        for start in range(0, len(ids), chunk):
            pieces.append((history[-CONTEXT_TOKENS:], ids[start : start + chunk]))
            history += ids[start : start + chunk]
        streams.append(pieces)
    return streams


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5])
def test_one_call_per_execution_gives_each_stream_its_own_text_utf8_safe_at_every_cut(tokenizer, chunk):
    from incremental_detokenizer import REPLACEMENT_CHARACTER, text_delta, text_deltas

    texts = [TEXT, " def f(x): return x ** 2", " Grüße aus Zürich 🚀🙂"]
    streams = _streams(tokenizer, texts, chunk)
    emitted = ["" for _ in texts]
    decode = CountingDecode(tokenizer)
    for step in range(max(len(stream) for stream in streams)):  # one execution per step: a response of every stream
        batch = [(index, stream[step]) for index, stream in enumerate(streams) if step < len(stream)]
        deltas = text_deltas(decode, [piece for _, piece in batch])
        for (index, piece), delta in zip(batch, deltas):
            assert delta == text_delta(tokenizer.decode, *piece), "the batched text is the one-at-a-time text"
            assert REPLACEMENT_CHARACTER not in delta and delta.encode("utf-8").decode("utf-8") == delta
            emitted[index] += delta
    assert emitted == texts
    assert decode.calls == max(len(stream) for stream in streams)


def test_a_batch_mixing_streamed_non_streamed_and_context_free_pieces(tokenizer):
    from incremental_detokenizer import CONTEXT_TOKENS, text_delta, text_deltas

    prompt = tokenizer.encode("# prompt")
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    pieces = [
        (prompt[-CONTEXT_TOKENS:], ids[:3]),  # a streamed response
        (prompt[-CONTEXT_TOKENS:], ids),  # a non-streamed response, prompt excluded: context is the prompt's tail
        ([], prompt + ids),  # a non-streamed response with the prompt in it: no context
        (None, ids[3:5]),  # TensorRT-LLM's C++ backend: no PRECEDING_IDS, decoded alone as upstream does
        (prompt[-CONTEXT_TOKENS:], []),  # a response without new tokens
    ]
    decode = CountingDecode(tokenizer)
    assert text_deltas(decode, pieces) == [
        text_delta(tokenizer.decode, *pieces[0]),
        TEXT,
        tokenizer.decode(prompt + ids),
        tokenizer.decode(ids[3:5]),
        "",
    ]
    assert decode.calls == 1


def test_a_decoder_that_rewrites_earlier_text_falls_back_for_those_pieces_only(code):
    from incremental_detokenizer import text_delta, text_deltas

    words = {1: "a", 2: "!", 3: "b"}

    def decode_batch(sequences):  # a decoder that rewrites the text already emitted when "!" follows
        calls.append(len(sequences))
        texts = ["".join(words[i] for i in ids) for ids in sequences]
        return [text.upper() if ids[-1:] == [2] else text for ids, text in zip(sequences, texts)]

    calls = []
    assert text_deltas(decode_batch, [([1], [2]), ([1], [3])]) == ["!", "b"]
    assert calls == [4, 1]  # the second call decodes only the rewritten piece's new tokens
    assert text_delta(lambda ids: decode_batch([ids])[0], [1], [2]) == "!"


def test_request_pieces_read_beams_rows_and_padded_context_in_output_order(code):
    from postprocessing_pieces import PostprocessingInputError, request_pieces

    tokens = np.array([[[5, 6, 7], [8, 9, 0]]], dtype=np.int32)  # one row, two beams, the second padded
    lengths = np.array([[3, 2]], dtype=np.int32)
    preceding = np.array([[[-1, 1, 2], [-1, -1, 3]]], dtype=np.int32)
    assert request_pieces(tokens, lengths, preceding) == [([1, 2], [5, 6, 7]), ([3], [8, 9])]
    assert request_pieces(tokens, lengths, None) == [(None, [5, 6, 7]), (None, [8, 9])]
    rows = np.array([[5, 6], [7, 0]], dtype=np.int32)  # two rows without a beam axis (a batched request)
    assert request_pieces(rows, np.array([[2], [1]], dtype=np.int32), None) == [(None, [5, 6]), (None, [7])]
    with pytest.raises(PostprocessingInputError, match="TOKENS_BATCH must have shape"):
        request_pieces(np.zeros(3, dtype=np.int32), lengths, None)
    with pytest.raises(PostprocessingInputError, match=r"PRECEDING_IDS must have shape \[1, 2, K\]"):
        request_pieces(tokens, lengths, np.zeros((1, 3, 2), dtype=np.int32))
    with pytest.raises(PostprocessingInputError, match="SEQUENCE_LENGTH"):
        request_pieces(rows, np.array([1, 2, 3], dtype=np.int32), None)


def test_batch_calls_of_the_tokenizer_equal_one_call_per_text(tokenizer):
    texts = [TEXT, "def f(x):", "x"]
    assert tokenizer.encode_batch(texts) == [tokenizer.encode(text) for text in texts]
    assert tokenizer.encode_batch(texts, add_special_tokens=False) == [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    ids = tokenizer.encode_batch(texts)
    assert tokenizer.decode_batch(ids) == [tokenizer.decode(sequence) for sequence in ids]
