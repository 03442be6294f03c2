"""The cpu tensorrt_llm model's Medusa parameters (model_repo/python/medusa_parameters.py): medusa_choices empty means
the engine's tree, and decoding_mode is overwritten to agree with the engine, with TensorRT-LLM's warning."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("model_code_medusa_parameters", REPO / "model_repo" / "python" / "medusa_parameters.py")
medusa_parameters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(medusa_parameters)


@pytest.mark.parametrize("raw, expected", [("", None), ("  ", None), ("{0}, {0, 0}", "{0}, {0, 0}"), (" {1} ", "{1}")])
def test_medusa_choices_empty_means_the_engines_tree(raw, expected):
    assert medusa_parameters.medusa_choices(raw) == expected


@pytest.mark.parametrize(
    "mode, medusa_engine, warned",
    [
        ("", True, None),
        ("medusa", True, None),
        ("MEDUSA", True, None),
        ("top_k_top_p", True, "decoding with medusa"),
        ("", False, None),
        ("top_k_top_p", False, None),
        ("beam_search", False, None),
        ("medusa", False, "decoding without it"),
    ],
)
def test_a_decoding_mode_that_disagrees_with_the_engine_is_overwritten_with_a_warning(mode, medusa_engine, warned):
    warning = medusa_parameters.decoding_mode_warning(mode, medusa_engine)
    if warned is None:
        assert warning is None
    else:
        assert warning.startswith("decoding_mode ") and warned in warning and "as TensorRT-LLM overwrites it" in warning
