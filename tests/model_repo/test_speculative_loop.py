"""The BLS's draft-target loop (model_repo/python/speculative_loop.py) against models with TensorRT-LLM's semantics:
a greedy draft proposes, a greedy draft_tokens_external target keeps the draft tokens equal to its own choices and adds
one token of its own. The loop's output must be the target's plain greedy output, whatever the draft proposes."""

from __future__ import annotations

import random
import sys

import pytest

from tests.conftest import REPO

MODEL_CODE = REPO / "model_repo" / "python"
VOCAB = 11


@pytest.fixture
def loop(monkeypatch):
    monkeypatch.syspath_prepend(str(MODEL_CODE))
    import speculative_loop

    yield speculative_loop
    sys.modules.pop("speculative_loop", None)


def next_token(sequence, salt=0):
    """A deterministic 'model': the next token is a function of the last three."""
    return (sum(sequence[-3:]) * 7 + len(sequence) % 3 + salt) % VOCAB


def greedy(sequence, n, salt=0):
    out = []
    for _ in range(n):
        out.append(next_token([*sequence, *out], salt))
    return out


def target_step(sequence, draft):
    """TensorRT-LLM's target with draft_input_ids: the accepted draft prefix, then its own next token."""
    emitted = []
    for token in draft:
        own = next_token([*sequence, *emitted])
        if own != token:
            break
        emitted.append(token)
    return [*emitted, next_token([*sequence, *emitted])]


@pytest.mark.parametrize("salt, k", [(0, 4), (3, 4), (0, 1), (5, 8)])
def test_the_loop_gives_the_targets_greedy_output(loop, salt, k):
    for seed in range(5):
        prompt = random.Random(seed).choices(range(VOCAB), k=6)
        result = loop.draft_target_generate(prompt, 23, k, lambda s, n: greedy(s, n, salt), target_step)
        assert result.tokens == greedy(prompt, 23)
        assert 0 <= result.accepted <= result.drafted
        if salt == 0:  # the draft is the target: every draft token is accepted
            assert result.accepted == result.drafted and result.acceptance_rate == 1.0
            assert result.target_steps == -(-23 // (k + 1))


def test_end_id_and_stop_words_end_the_loop(loop):
    prompt = [1, 2, 3]
    plain = greedy(prompt, 30)
    end = plain[9]
    result = loop.draft_target_generate(prompt, 30, 4, greedy, target_step, end_id=end)
    assert result.tokens == plain[: plain.index(end)]
    stop = plain[4:6]
    stopped = loop.draft_target_generate(prompt, 30, 4, greedy, target_step, stop_words=[stop])
    first = next(i for i in range(len(plain) - 1) if plain[i : i + 2] == stop)
    assert stopped.tokens == plain[: first + 2]  # cut where the stop word first ends, inside a step or not


def test_a_target_that_adds_nothing_ends_the_loop(loop):
    result = loop.draft_target_generate([1], 10, 4, greedy, lambda s, d: [])
    assert result.tokens == [] and result.target_steps == 1


def test_draft_logits_go_to_the_target_with_the_tokens_they_drew(loop):
    import numpy as np

    rows = np.arange(12, dtype=np.float32).reshape(4, 3)  # 4 draft tokens, vocabulary 3
    relay, sent = loop.DraftLogits(), []

    def draft(sequence, n):
        ids = [next_token(sequence + list(range(i)), salt=1) for i in range(4)]  # the draft model made 4 tokens
        relay.keep(ids, rows)
        return ids

    def target(sequence, draft_ids):
        sent.append((list(draft_ids), relay.for_target(draft_ids)))
        return [next_token(sequence)]

    loop.draft_target_generate([1, 2, 3], 3, 4, draft, target)  # max_tokens 3: the first draft is cut to 2 tokens
    assert len(sent[0][0]) == 2 and np.array_equal(sent[0][1], rows[:2])
    assert all(logits is None or len(logits) == len(ids) for ids, logits in sent)
    relay.keep([5, 6], None)  # a draft model that returned no generation_logits: refused by name
    with pytest.raises(ValueError, match="use_draft_logits: the draft model returned 0 generation_logits rows"):
        relay.for_target([5, 6])


def test_use_draft_logits_true_needs_a_draft_target_engine_and_drafts(loop):
    refusal = loop.use_draft_logits_refusal
    assert refusal(None, max_draft_len=0, drafts=False) is None and refusal(False, max_draft_len=0, drafts=False) is None
    assert refusal(True, max_draft_len=4, drafts=True) is None
    assert refusal(True, max_draft_len=0, drafts=True).startswith("use_draft_logits: true needs draft-target speculative decoding")
    assert refusal(True, max_draft_len=4, drafts=False).startswith("use_draft_logits: true needs num_draft_tokens > 0")
