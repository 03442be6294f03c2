"""The shipped speculative draft agrees with the default model where speculation needs it.

Greedy agreement (teacher-forced) bounds the acceptance rate of greedy speculative decoding; the
draft was distilled mostly on the target's own continuations (models/tiny-stdlib-llama-draft).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
TARGET_DIR = REPO / "models" / "tiny-stdlib-llama"
DRAFT_DIR = REPO / "models" / "tiny-stdlib-llama-draft"


def _training_script():
    spec = importlib.util.spec_from_file_location("train_draft_model", REPO / "scripts" / "train_draft_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(path: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def setting():
    script = _training_script()
    tok = transformers.AutoTokenizer.from_pretrained(str(TARGET_DIR), local_files_only=True)
    stream = script.heldout_stream(tok, REPO / "data", bos_id=1)
    return script, _model(TARGET_DIR), _model(DRAFT_DIR), stream


@pytest.mark.slow  # 7 s here
def test_target_continuations_are_the_targets_greedy_output(setting):
    script, target, _, stream = setting
    windows = script.target_continuations(target, stream, 2, 96, 32, seed=7)
    assert windows.shape == (2, 97)
    for window in windows:
        again = target.generate(input_ids=window[None, :32], do_sample=False, max_new_tokens=65, min_new_tokens=65)
        assert torch.equal(again[0], window)


@pytest.mark.slow  # 7-23 s here with one torch thread
def test_draft_agrees_with_the_target_on_its_continuations_of_heldout_prompts(setting):
    script, target, draft, stream = setting
    continuations = script.target_continuations(target, stream, 8, 256, 64, seed=11)[:, :256].reshape(-1)
    assert script.greedy_agreement(draft, target, continuations, 256) >= 0.75
    assert script.greedy_agreement(draft, target, stream, 256, max_windows=8) >= 0.55


def test_a_self_distill_fraction_outside_0_to_1_is_refused_by_name_before_anything_is_written(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "draft"
    command = [sys.executable, str(REPO / "scripts" / "train_default_model.py"), "--draft-of", str(TARGET_DIR), "--out", str(out), "--self-distill", "1.5"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "--self-distill must be a fraction from 0 to 1, got 1.5" in result.stderr
    assert not out.exists()
