"""The quantization a build runs with comes from one place (pipeline.config.effective_quantization): a published
ModelOpt checkpoint served as published is built as the project's own quantization of the same model is. The
engine's trtllm-build command for a published FP8 + FP8 KV checkpoint (quantize.algo none) equals the one for the
project's own fp8 + fp8 KV quantization of its unquantized weights, paths aside; the format rules and the capacity
planner see the published format too."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from pipeline.backends.engine.trtllm_build import plan_trtllm_build
from pipeline.capacity.for_spec import spec_capacity
from pipeline.config.effective_quantization import effective_quantize
from pipeline.config.loader import LoadedConfig, load_config
from pipeline.errors import SpecError
from pipeline.trtllm_versions import get_version
from tests.conftest import REPO
from tests.support import prequantized_fixtures as fx

CHECKPOINT, ENGINE = Path("/artifacts/q/quantize/trtllm_checkpoint"), Path("/artifacts/q/build/engine")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("effective")
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        base = fx.tiny_qwen2(root / "base")
        return {
            "base": base,
            "fp8": fx.modelopt_export(base, "fp8", root / "fp8", kv_cache="fp8"),
            "int4_awq": fx.modelopt_export(base, "int4_awq", root / "int4_awq"),
        }
    finally:
        torch.set_num_threads(previous)


def _load(tmp_path: Path, source: Path, *, target: str = "engine", algo: str = "none", kv: str = "none", extra: str = "") -> LoadedConfig:
    path = tmp_path / f"{source.name}-{target}-{algo}.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            name: q
            model:
              source: {source}
              dtype: float16
            quantize:
              algo: {algo}
              kv_cache: {kv}
              calibration: {{files: ["{REPO}/data/calibration/*.txt"]}}
            build:
              target: {target}
              max_input_len: 128
              max_seq_len: 256
            """
        )
        + extra
    )
    return load_config(path)


def _build(loaded: LoadedConfig):
    return plan_trtllm_build(loaded.spec, loaded.model, CHECKPOINT, ENGINE, get_version("1.2.1"), 90)


def test_the_published_fp8_checkpoint_gets_the_trtllm_build_command_of_the_projects_own_fp8(sources, tmp_path: Path) -> None:
    published = _build(_load(tmp_path, sources["fp8"]))
    own = _build(_load(tmp_path, sources["base"], algo="fp8", kv="fp8"))
    assert published.argv == own.argv
    assert published.build_config == own.build_config
    assert published.decisions == own.decisions
    assert (published.settings.quant_algo, published.settings.kv_cache_quant) == ("fp8", "fp8")
    assert published.build_config["plugin_config"]["use_fp8_context_fmha"] is True
    # read as the spec says (unquantized), the same build would turn FP8 context attention off
    plain = _build(_load(tmp_path, sources["base"]))
    assert plain.build_config["plugin_config"]["use_fp8_context_fmha"] is False


@pytest.mark.parametrize("target, expected", [("engine", ("fp8", "fp8")), ("cpu", ("fp8", "fp8"))])
def test_the_effective_quantization_is_the_published_format_where_it_is_served(sources, tmp_path: Path, target: str, expected) -> None:
    loaded = _load(tmp_path, sources["fp8"], target=target)
    quantize = effective_quantize(loaded.spec, loaded.model.path)
    assert (quantize.algo.value, quantize.kv_cache.value) == expected
    assert (loaded.spec.quantize.algo.value, loaded.spec.quantize.kv_cache.value) == ("none", "none")  # the spec as written
    awq = _load(tmp_path, sources["int4_awq"], target=target)
    quantize = effective_quantize(awq.spec, awq.model.path)
    assert (quantize.algo.value, quantize.group_size) == ("int4_awq", 64)


def test_an_unquantized_source_keeps_the_specs_own_quantization(sources, tmp_path: Path) -> None:
    loaded = _load(tmp_path, sources["base"], algo="fp8", kv="fp8")
    quantize = effective_quantize(loaded.spec, loaded.model.path)
    assert (quantize.algo, quantize.kv_cache, quantize.group_size) == (loaded.spec.quantize.algo, loaded.spec.quantize.kv_cache, 128)


def test_the_format_rules_see_the_published_format(sources, tmp_path: Path) -> None:
    explicit = "  plugins:\n    use_fp8_context_fmha: true\n"
    _load(tmp_path, sources["fp8"], extra=explicit)  # FP8 weights: FP8 context attention is taken
    with pytest.raises(SpecError) as plain:
        _load(tmp_path, sources["base"], extra=explicit)
    assert "build.plugins.use_fp8_context_fmha: true needs quantize.algo fp8, w4a8_awq or nvfp4, got none" in plain.value.message
    with pytest.raises(SpecError) as awq:
        _load(tmp_path, sources["int4_awq"], extra=explicit)
    message = awq.value.message
    assert str(sources["int4_awq"] / "hf_quant_config.json") in message and "model.source holds ModelOpt INT4 AWQ" in message
    assert "served as published as quantize.algo int4_awq" in message and "got int4_awq" in message


def test_the_capacity_planner_counts_a_published_checkpoint_at_its_format(sources, tmp_path: Path) -> None:
    published = spec_capacity(*_spec_and_model(_load(tmp_path, sources["fp8"])), gpu="H100-80GB")
    own = spec_capacity(*_spec_and_model(_load(tmp_path, sources["base"], algo="fp8", kv="fp8")), gpu="H100-80GB")
    assert (published.quant_algo, published.kv_cache_dtype) == ("fp8", "fp8")
    assert (published.weight_bytes, published.kv_bytes_per_token) == (own.weight_bytes, own.kv_bytes_per_token)


def _spec_and_model(loaded: LoadedConfig):
    return loaded.spec, loaded.model
