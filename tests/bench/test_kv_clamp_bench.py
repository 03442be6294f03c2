"""`bench kv-clamp`'s pieces: the K/V-shrunk model computes what the model computes, the greedy comparison counts
right, and a shrink that is not an exact fp16 re-parametrisation is refused before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.kv_clamp_bench import greedy_agreement, run_kv_clamp_bench, shrink_kv
from pipeline.errors import StageError
from tests.conftest import DEFAULT_MODEL, REPO


def test_the_shrunk_model_has_small_k_v_and_the_same_logits(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    shrunk_dir = shrink_kv(DEFAULT_MODEL, tmp_path / "shrunk", 512)
    models = [AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval() for d in (DEFAULT_MODEL, shrunk_dir)]
    ids = torch.arange(3, 67).reshape(1, -1)
    captured: list[torch.Tensor] = []
    hook = models[1].model.layers[0].self_attn.k_proj.register_forward_hook(lambda m, i, out: captured.append(out))
    with torch.no_grad():
        original, shrunk = (m(ids).logits for m in models)
        keys = models[0].model.layers[0].self_attn.k_proj(models[0].model.layers[0].input_layernorm(models[0].model.embed_tokens(ids)))
    hook.remove()
    # 512x smaller keys; k_proj weights that turn fp16-subnormal round (the bench's documented inexactness)
    assert float((captured[0] * 512 - keys).abs().max()) <= 1e-3 * float(keys.abs().max())
    torch.testing.assert_close(shrunk, original, rtol=1e-3, atol=2e-3)
    assert torch.equal(shrunk.argmax(-1), original.argmax(-1))


def test_greedy_agreement_counts_positions_matches_and_the_first_divergence() -> None:
    reference = [(1, 2, 3, 4), (5, 6, 7, 8)]
    candidate = [(1, 2, 3, 4), (5, 9, 7, 8)]
    assert greedy_agreement(reference, candidate) == {
        "greedy_agreement": 7 / 8,
        "greedy_identical": 1,
        "greedy_sequences": 2,
        "greedy_first_divergence": (4 + 1) / 2,
    }


def test_a_shrink_that_is_not_a_power_of_two_is_refused() -> None:
    with pytest.raises(StageError, match=r"--shrink 100 is not a power of two"):
        run_kv_clamp_bench(REPO / "build_configs" / "tiny-cpu-fp8.yaml", shrinks=(100,))
