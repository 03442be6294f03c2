"""scripts/train_medusa_heads.py's parts on the default model: untrained heads start as the base lm_head, the
weights travel under the Medusa checkpoint's names and back, the ranks it measures are the true tokens' ranks,
and bad arguments are refused by name."""

from __future__ import annotations

import pytest

from tests.conftest import DEFAULT_MODEL
from tests.support.script_modules import import_script

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def script():
    return import_script("train_medusa_heads")


@pytest.fixture(scope="module")
def base():
    return transformers.AutoModelForCausalLM.from_pretrained(str(DEFAULT_MODEL), local_files_only=True, dtype=torch.float32).eval()


def test_untrained_heads_guess_what_the_base_model_would_say_next(script, base):
    heads = script.MedusaHeads(3, 2, base.lm_head.weight.detach())
    ids = torch.randint(3, 4096, (2, 24), generator=torch.Generator().manual_seed(0))
    hidden, base_logits = script.backbone(base, ids)
    with torch.no_grad():
        logits = heads(hidden)
    assert logits.shape == (3, 2, 24, 4096)
    for head_logits in logits:
        assert torch.allclose(head_logits, base_logits, atol=1e-5)


def test_the_weights_round_trip_through_the_medusa_checkpoint_names(script, base):
    heads = script.MedusaHeads(2, 1, base.lm_head.weight.detach())
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.normal_(generator=torch.Generator().manual_seed(1))
    state = heads.contract_state()
    assert set(state) == {"0.0.linear.weight", "0.0.linear.bias", "0.1.weight", "1.0.linear.weight", "1.0.linear.bias", "1.1.weight"}
    assert {tensor.dtype for tensor in state.values()} == {torch.float16}
    again = script.MedusaHeads(2, 1, torch.zeros_like(base.lm_head.weight))
    script.load_contract_state(again, state)
    for mine, theirs in zip(heads.parameters(), again.parameters()):
        assert torch.equal(mine.detach().half().float(), theirs.detach())


def test_the_measured_ranks_are_the_true_tokens_ranks_among_each_heads_logits(script, base):
    heads = script.MedusaHeads(2, 1, base.lm_head.weight.detach())
    windows = torch.randint(3, 4096, (2, 16), generator=torch.Generator().manual_seed(2))
    ranks = script.true_token_ranks(heads, base, windows, first=3)
    assert ranks.shape == (2 * (16 - 2 - 2 - 3 + 1), 2)  # positions 3..10 of each window, one column per head
    hidden, _ = script.backbone(base, windows)
    with torch.no_grad():
        logits = heads(hidden)
    order = logits[1, 1, 5].argsort(descending=True).tolist()  # head 1, window 1, position 5 guesses token 8
    expected = min(order.index(int(windows[1, 8])), script.MAX_RANK)
    assert int(ranks[8 + 2, 1]) == expected
    top1 = script.topk_accuracies(ranks)
    assert top1[1][script.MAX_RANK - 1] == pytest.approx(float((ranks[:, 1] < script.MAX_RANK).float().mean()), abs=1e-4)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--recommend", "12"], "--recommend 12 must be one of --budgets 4,8,16,32,63"),
        (["--self-distill", "1.5"], "--self-distill must be a fraction from 0 to 1, got 1.5"),
        (["--distill-weight", "-0.1"], "--distill-weight must be a fraction from 0 to 1, got -0.1"),
        (["--heads", "0"], "--heads must be >= 1 and --layers >= 0, got 0 and 1"),
    ],
)
def test_bad_arguments_are_refused_by_name(script, argv, message):
    with pytest.raises(SystemExit, match=message):
        script.parse_args(argv)
