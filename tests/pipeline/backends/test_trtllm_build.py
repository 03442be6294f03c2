"""The engine target's trtllm-build command: version table, argument schema, golden commands, the builder's decisions.

Regenerate the golden commands explicitly: `UPDATE_GOLDEN=1 pytest tests/pipeline/backends/test_trtllm_build.py`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path

import pytest

from pipeline.backends.cpu.target import cpu_build_config
from pipeline.backends.engine.build_rules import resolve
from pipeline.backends.engine.trtllm_build import (
    BuildRequest,
    plan_from_request,
    plan_trtllm_build,
    render_script,
    request_from_spec,
)
from pipeline.config.loader import load_config
from pipeline.errors import SpecError
from pipeline.trtllm_versions import (
    DEFAULT_VERSION,
    SUPPORTED_VERSIONS,
    ArgvSchemaError,
    get_version,
    load_argument_schema,
    validate_argv,
)
from tests.conftest import BUILD_CONFIGS, REPO

SCHEMA = load_argument_schema(REPO / "tests" / "data" / "trtllm_build_1_2_1_args.json")
GOLDEN = REPO / "tests" / "golden" / "trtllm_build"
V121 = get_version("1.2.1")
GPU_CONFIGS = sorted(p for p in BUILD_CONFIGS.glob("*.yaml") if "target: engine" in p.read_text())


def _paths(name: str) -> tuple[Path, Path]:
    return Path(f"/artifacts/{name}/quantize/trtllm_checkpoint"), Path(f"/artifacts/{name}/build/engine")


def _plan(path: Path, sm: int | None = None, **kwargs):
    loaded = load_config(path)
    return plan_trtllm_build(loaded.spec, loaded.model, *_paths(loaded.spec.name), V121, sm, **kwargs)


@pytest.fixture(scope="module")
def base() -> BuildRequest:
    """Llama-3.1-8B FP8 + FP8 KV as the YAML asks for it (a valid starting point for each rule)."""
    loaded = load_config(BUILD_CONFIGS / "llama-3.1-8b-fp8.yaml")
    return request_from_spec(loaded.spec, loaded.model)


def _resolve(base: BuildRequest, sm: int | None = None, **changes):
    return resolve(dataclasses.replace(base, **changes), sm)


def _decision(decisions, field: str, kind: str = "changed"):
    found = [d for d in decisions if d.field == field and d.kind == kind]
    assert found, f"no {kind} decision for {field}: {[str(d) for d in decisions]}"
    return found[0]


def _flags(argv) -> dict[str, list[str]]:
    """flag -> its values (--lora_dir and --lora_target_modules take several)."""
    flags: dict[str, list[str]] = {}
    current = None
    for token in argv[1:]:
        if token.startswith("--"):
            current = flags.setdefault(token, [])
        else:
            current.append(token)
    return flags


def _no_decision(decisions, field: str) -> None:
    assert not [d for d in decisions if d.field == field and d.kind == "changed"], [str(d) for d in decisions]


# -- versions -----------------------------------------------------------------------------------------
def test_default_version_is_the_last_engine_line():
    assert DEFAULT_VERSION == "1.2.1" and list(SUPPORTED_VERSIONS)[0] == "1.2.1"
    assert V121.tensorrt == "10.14.1.48" and V121.triton_tag_inferred
    assert V121.image == f"nvcr.io/nvidia/tritonserver:{V121.triton_tag}-trtllm-python-py3"
    assert get_version("1.1.0").image == "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
    assert get_version("1.0.0").tensorrt == "10.11.0.33" and not get_version("1.0.0").triton_tag_inferred


def test_version_defaults_follow_the_reference():
    for version in SUPPORTED_VERSIONS.values():
        assert version.default("--tokens_per_block") == "32"
        assert version.default("--use_paged_context_fmha") == "enable"
        assert version.default("--use_fp8_context_fmha") == "enable"
        assert version.default("--max_batch_size") == "2048"
        assert version.default("--max_num_tokens") == "8192"
    assert not V121.accepts("--auto_parallel") and not V121.accepts("--cluster_key")
    assert get_version("1.1.0").accepts("--auto_parallel") and get_version("1.0.0").accepts("--gpus_per_node")


def test_unknown_version_names_it_and_lists_supported():
    with pytest.raises(SpecError, match=r"'0\.16\.0' is not supported.*supported: 1\.2\.1, 1\.1\.0, 1\.0\.0"):
        get_version("0.16.0")


def test_version_after_the_engine_line_says_why():
    with pytest.raises(SpecError, match=r"removed from TensorRT-LLM after the 1\.2\.x line"):
        get_version("1.3.0")


def test_schema_and_version_table_agree():
    assert set(SCHEMA["flags"]) == V121.flags
    for flag, meta in SCHEMA["flags"].items():
        default = meta.get("default")
        assert (None if default is None else str(default)) == V121.default(flag), flag
    assert not set(SCHEMA["removed"]) & V121.flags


# -- the GPU build configs: schema + golden ---------------------------------------------------------------
@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda p: p.stem)
def test_gpu_config_command_validates_against_schema(path):
    validate_argv(_plan(path).argv, SCHEMA)


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda p: p.stem)
def test_gpu_config_command_matches_golden(path):
    # paths inside the checkout (LoRA adapter directories) are shown relative to it, so the files do not depend on where it lives
    script = render_script(_plan(path)).replace(str(REPO), "<checkout>")
    golden = GOLDEN / f"{path.stem}.sh"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(script)
        pytest.skip(f"golden file rewritten: {golden}")
    assert golden.is_file(), f"{golden} is missing; create it with UPDATE_GOLDEN=1"
    if script != golden.read_text():
        diff = "".join(difflib.unified_diff(golden.read_text().splitlines(True), script.splitlines(True), str(golden), "rendered"))
        pytest.fail(f"rendered command differs from the golden file; if intended, regenerate with UPDATE_GOLDEN=1\n{diff}")


def test_gpu_configs_are_found():
    assert {p.stem for p in GPU_CONFIGS} >= {
        "llama-3.1-8b-fp8",
        "llama-3.1-8b-int4-awq",
        "llama-3.3-70b-fp8-tp2",
        "mistral-7b-int8-sq",
        "llama-3.1-8b-fp8-lora",
        "llama-3.1-8b-fp8-lookahead",
    }


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda p: p.stem)
def test_build_config_json_and_argv_say_the_same(path):
    build = _plan(path)
    flags = {flag: values[0] if len(values) == 1 else values for flag, values in _flags(build.argv).items()}
    cfg, plugins = build.build_config, build.build_config["plugin_config"]
    for key in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width"):
        assert flags[f"--{key}"] == str(cfg[key]), key
    assert flags["--tokens_per_block"] == str(plugins["tokens_per_block"])
    assert flags["--kv_cache_type"].upper() == cfg["kv_cache_type"] and plugins["paged_kv_cache"] == (cfg["kv_cache_type"] == "PAGED")
    for key in (
        "context_fmha",
        "use_paged_context_fmha",
        "use_fp8_context_fmha",
        "use_fused_mlp",
        "reduce_fusion",
        "multiple_profiles",
        "remove_input_padding",
    ):
        assert flags[f"--{key}"] == ("enable" if plugins[key] else "disable"), key
    assert flags["--build_config"] == str(build.build_config_path)
    assert flags["--output_timing_cache"] == cfg["output_timing_cache"] == str(build.output_dir / "model.cache")
    lora = cfg["lora_config"]
    if "--lora_plugin" in flags:
        assert flags["--lora_plugin"] == plugins["lora_plugin"]
        assert _flags(build.argv)["--lora_dir"] == lora["lora_dir"] and flags["--lora_ckpt_source"] == lora["lora_ckpt_source"]
        assert _flags(build.argv)["--lora_target_modules"] == lora["lora_target_modules"]
        assert flags["--max_lora_rank"] == str(lora["max_lora_rank"])
    else:
        assert "lora_plugin" not in plugins and lora == {"lora_dir": [], "lora_ckpt_source": "hf", "max_lora_rank": 64, "lora_target_modules": []}
    if "--speculative_decoding_mode" in flags:
        assert flags["--max_draft_len"] == str(cfg["max_draft_len"])
        assert cfg["speculative_decoding_mode"] == {"lookahead_decoding": 8, "draft_tokens_external": 2}[flags["--speculative_decoding_mode"]]
    else:
        assert cfg["max_draft_len"] == 0 and cfg["speculative_decoding_mode"] == 1


def test_build_config_carries_every_key_the_cpu_engine_records(base):
    loaded = load_config(BUILD_CONFIGS / "llama-3.1-8b-fp8.yaml")
    cpu = cpu_build_config(loaded.spec.build, max_seq_len=8192, dtype="bfloat16")
    engine = _plan(BUILD_CONFIGS / "llama-3.1-8b-fp8.yaml").build_config
    assert set(cpu) <= set(engine)
    assert set(cpu["plugin_config"]) <= set(engine["plugin_config"])


def test_timing_cache_is_absolute_inside_output_dir():
    build = _plan(GPU_CONFIGS[0])
    assert build.timing_cache_path.is_absolute() and build.timing_cache_path.parent == build.output_dir


def test_relative_paths_are_refused(base):
    with pytest.raises(SpecError, match="checkpoint_dir must be an absolute path"):
        plan_from_request(base, Path("/hf"), Path("ckpt"), Path("/out"), V121)


def test_bad_log_level_and_workers_are_refused(base):
    with pytest.raises(SpecError, match="log level 'loud'"):
        plan_from_request(base, Path("/hf"), Path("/ckpt"), Path("/out"), V121, log_level="loud")
    with pytest.raises(SpecError, match="workers must be >= 1"):
        plan_from_request(base, Path("/hf"), Path("/ckpt"), Path("/out"), V121, workers=0)


def test_workers_beyond_world_size_are_clamped_with_a_decision(base):
    build = plan_from_request(base, Path("/hf"), Path("/ckpt"), Path("/out"), V121, workers=4)
    assert build.workers == 1 and "--workers" in build.argv and build.argv[build.argv.index("--workers") + 1] == "1"
    assert _decision(build.decisions, "build.workers").applied == 1


# -- argv validator -------------------------------------------------------------------------------------
def _argv(*extra: str) -> list[str]:
    return ["trtllm-build", "--checkpoint_dir", "/c", "--output_dir", "/o", *extra]


def test_validator_accepts_aliases_and_case_insensitive_kv_type():
    validate_argv(_argv("--max_decoder_seq_len", "4096", "--kv_cache_type", "PAGED", "--lora_dir", "/a", "/b"), SCHEMA)


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--frobnicate", "1"), "--frobnicate: unknown trtllm-build flag"),
        (("--auto_parallel", "2"), r"--auto_parallel: not a trtllm-build 1\.2\.1 flag \(removed in 1\.2"),
        (("--max_output_len", "10"), "removed in 0.12"),
        (("--kv_cache_type", "blocked"), "'blocked' is not one of continuous, paged, disabled"),
        (("--use_fused_mlp", "yes"), "'yes' is not one of enable, disable"),
        (("--max_batch_size", "many"), "expects an integer, got 'many'"),
        (("--max_batch_size", "0"), "must be >= 1"),
        (("--gather_context_logits", "true"), "takes no value"),
        (("--max_seq_len",), "takes exactly one value, got 0"),
        (("--output_dir", "/x"), "given more than once"),
        (("--paged_kv_cache", "enable"), "deprecated"),
    ],
)
def test_validator_rejects(extra, message):
    with pytest.raises(ArgvSchemaError, match=message):
        validate_argv(_argv(*extra), SCHEMA)


def test_validator_needs_a_checkpoint_and_the_tool_name():
    with pytest.raises(ArgvSchemaError, match="one of --checkpoint_dir, --model_config is required"):
        validate_argv(["trtllm-build", "--output_dir", "/o"], SCHEMA)
    with pytest.raises(ArgvSchemaError, match="must start with 'trtllm-build'"):
        validate_argv(["trtllm-buidl", "--checkpoint_dir", "/c"], SCHEMA)


# -- builder constraints: errors --------------------------------------------------------------------------
def test_opt_num_tokens_with_multiple_profiles_is_an_error(base):
    with pytest.raises(SpecError, match=r"build\.opt_num_tokens \(4096\) cannot be set with build\.plugins\.multiple_profiles"):
        _resolve(base, opt_num_tokens=4096, multiple_profiles=True)


def test_max_num_tokens_below_tokens_per_block_is_an_error(base):
    with pytest.raises(SpecError, match=r"build\.max_num_tokens \(16\) is less than build\.tokens_per_block \(32\)"):
        _resolve(base, max_num_tokens=16)


@pytest.mark.parametrize(
    "algo, kv, message",
    [
        ("fp8", "none", r"quantize\.algo fp8 needs FP8 tensor cores .* SM 8\.0"),
        ("w4a8_awq", "none", r"quantize\.algo w4a8_awq needs FP8 tensor cores"),
        ("none", "fp8", r"quantize\.kv_cache fp8 needs SM >= 8\.9"),
    ],
)
def test_fp8_below_sm89_is_an_error_when_a_gpu_is_declared(base, algo, kv, message):
    with pytest.raises(SpecError, match=message):
        _resolve(base, 80, quant_algo=algo, kv_cache_quant=kv, enable_kv_cache_reuse=False, enable_chunked_context=False)


def test_fp8_without_a_declared_gpu_is_a_warning(base):
    _, decisions = _resolve(base, None)
    assert "no GPU declared" in _decision(decisions, "quantize.algo", "warning").reason


def test_fp8_on_ada_and_hopper_is_fine(base):
    for sm in (89, 90):
        _resolve(base, sm)


def test_nvfp4_needs_blackwell(base):
    with pytest.raises(SpecError, match=r"nvfp4 needs a Blackwell GPU \(SM >= 10\.0\); the GPU is SM 9\.0"):
        _resolve(base, 90, quant_algo="nvfp4", kv_cache_quant="fp8")


@pytest.mark.parametrize(
    "algo, kv, what",
    [
        ("int8_wo", "none", "quantize.algo int8_wo"),
        ("int4_awq", "none", "quantize.algo int4_awq"),
        ("int8_sq", "none", "quantize.algo int8_sq"),
        ("none", "int8", "quantize.kv_cache int8"),
    ],
)
def test_blackwell_rejects_int8_int4_weight_only_sq_and_int8_kv(base, algo, kv, what):
    with pytest.raises(SpecError, match=rf"{what} is rejected by trtllm-build on Blackwell \(SM 10\.0\)"):
        _resolve(base, 100, quant_algo=algo, kv_cache_quant=kv, enable_kv_cache_reuse=False, enable_chunked_context=False)


def test_blackwell_builds_fp8_and_w4a8(base):
    _resolve(base, 100)
    _resolve(base, 100, quant_algo="w4a8_awq")


def test_paged_kv_without_attention_plugin_is_an_error(base):
    with pytest.raises(SpecError, match="build.kv_cache_type paged needs build.plugins.gpt_attention_plugin"):
        _resolve(base, gpt_attention_plugin="disable")


@pytest.mark.parametrize("gemm, algo", [("fp8", "none"), ("nvfp4", "fp8")])
def test_quantized_gemm_plugin_needs_its_format(base, gemm, algo):
    with pytest.raises(SpecError, match=rf"gemm_plugin {gemm} needs quantize\.algo {gemm} \(got {algo}\)"):
        _resolve(base, gemm_plugin=gemm, quant_algo=algo, kv_cache_quant="none")


def test_max_input_len_must_stay_below_a_deduced_max_seq_len(base):
    with pytest.raises(SpecError, match=r"build\.max_input_len \(200000\) must be less than build\.max_seq_len \(131072\)"):
        _resolve(base, max_seq_len=None, max_input_len=200_000, max_num_tokens=8192)


def test_serve_features_that_lose_paged_context_fmha_are_errors(base):
    with pytest.raises(SpecError, match=r"serve\.enable_kv_cache_reuse: true needs paged context FMHA.*int8"):
        _resolve(base, quant_algo="int8_sq", kv_cache_quant="int8")


def test_every_violation_is_reported_at_once(base):
    with pytest.raises(SpecError) as info:
        _resolve(base, 80, max_num_tokens=16, opt_num_tokens=8, multiple_profiles=True)
    assert "max_num_tokens (16)" in info.value.message and "multiple_profiles" in info.value.message and "FP8 tensor cores" in info.value.message


# -- builder silent overrides: explicit decisions ---------------------------------------------------------------
_NO_SERVE = {"enable_kv_cache_reuse": False, "enable_chunked_context": False}


def test_fp8_context_fmha_off_for_non_fp8_quant(base):
    settings, decisions = _resolve(base, quant_algo="int4_awq", kv_cache_quant="none")
    assert settings.use_fp8_context_fmha is False
    d = _decision(decisions, "build.plugins.use_fp8_context_fmha")
    assert (d.requested, d.applied) == (True, False) and "int4_awq" in d.reason


def test_fp8_kv_with_non_fp8_quant_turns_paged_context_fmha_off(base):
    settings, decisions = _resolve(base, quant_algo="int8_sq", kv_cache_quant="fp8", **_NO_SERVE)
    assert settings.use_paged_context_fmha is False
    assert "FP8 paged context FMHA" in _decision(decisions, "build.plugins.use_paged_context_fmha").reason


def test_sm_below_89_fp8_context_fmha_is_switched_off_by_the_quant_rule(base):
    settings, decisions = _resolve(base, 80, quant_algo="none", kv_cache_quant="none")
    assert settings.use_fp8_context_fmha is False
    _decision(decisions, "build.plugins.use_fp8_context_fmha")


def test_fp8_kv_with_paged_context_forces_fp8_context_fmha_on(base):
    settings, decisions = _resolve(base, use_fp8_context_fmha=False)
    assert settings.use_fp8_context_fmha is True
    d = _decision(decisions, "build.plugins.use_fp8_context_fmha")
    assert (d.requested, d.applied) == (False, True)


def test_fp8_weights_without_fp8_kv_turn_fp8_context_fmha_off(base):
    settings, decisions = _resolve(base, kv_cache_quant="none")
    assert settings.use_fp8_context_fmha is False
    assert "without an FP8 KV cache" in _decision(decisions, "build.plugins.use_fp8_context_fmha").reason


def test_int8_kv_turns_paged_context_fmha_off(base):
    settings, decisions = _resolve(base, quant_algo="int8_sq", kv_cache_quant="int8", **_NO_SERVE)
    assert settings.use_paged_context_fmha is False
    assert "int8" in _decision(decisions, "build.plugins.use_paged_context_fmha").reason


def test_context_fmha_off_turns_paged_and_fp8_context_fmha_off(base):
    settings, decisions = _resolve(base, context_fmha=False, **_NO_SERVE)
    assert not settings.use_paged_context_fmha and not settings.use_fp8_context_fmha
    _decision(decisions, "build.plugins.use_paged_context_fmha")
    _decision(decisions, "build.plugins.use_fp8_context_fmha")


def test_non_paged_kv_cache_turns_paged_context_fmha_off(base):
    settings, decisions = _resolve(base, kv_cache_type="continuous", **_NO_SERVE)
    assert settings.use_paged_context_fmha is False
    assert "continuous" in _decision(decisions, "build.plugins.use_paged_context_fmha").reason


@pytest.mark.parametrize("algo", ["int8_sq", "int8_wo", "int4_awq", "w4a8_awq", "nvfp4"])
def test_fused_mlp_off_for_quant_other_than_fp8(base, algo):
    settings, decisions = _resolve(base, quant_algo=algo, kv_cache_quant="none", **_NO_SERVE)
    assert settings.use_fused_mlp is False
    _decision(decisions, "build.plugins.use_fused_mlp")


@pytest.mark.parametrize("algo", ["none", "fp8"])
def test_fused_mlp_stays_for_fp8_and_unquantized(base, algo):
    settings, decisions = _resolve(base, quant_algo=algo, kv_cache_quant="none")
    assert settings.use_fused_mlp is True
    _no_decision(decisions, "build.plugins.use_fused_mlp")


def test_reduce_fusion_off_with_one_rank(base):
    settings, decisions = _resolve(base, reduce_fusion=True)
    assert settings.reduce_fusion is False
    assert "tp_size is 1" in _decision(decisions, "build.plugins.reduce_fusion").reason


def test_reduce_fusion_off_for_other_architectures(base):
    settings, decisions = _resolve(base, reduce_fusion=True, tp_size=2, architecture="MistralForCausalLM")
    assert settings.reduce_fusion is False
    assert "MistralForCausalLM" in _decision(decisions, "build.plugins.reduce_fusion").reason


def test_reduce_fusion_kept_for_llama_with_tp(base):
    settings, decisions = _resolve(base, reduce_fusion=True, tp_size=2)
    assert settings.reduce_fusion is True
    _no_decision(decisions, "build.plugins.reduce_fusion")
    assert _decision(decisions, "plugin_config.nccl_plugin", "note").applied == "enabled"


def test_max_num_tokens_clamped_to_batch_times_seq_len(base):
    settings, decisions = _resolve(base, max_batch_size=1, max_seq_len=4096, max_input_len=1024)
    assert settings.max_num_tokens == 4096
    d = _decision(decisions, "build.max_num_tokens")
    assert (d.requested, d.applied) == (8192, 4096)


def test_remove_input_padding_off_fixes_max_num_tokens(base):
    settings, decisions = _resolve(base, remove_input_padding=False, opt_num_tokens=1024)
    assert settings.max_num_tokens == 64 * 8192 and settings.opt_num_tokens is None
    _decision(decisions, "build.max_num_tokens")
    _decision(decisions, "build.opt_num_tokens")


def test_max_num_tokens_raised_to_max_input_len_without_context_fmha(base):
    settings, decisions = _resolve(base, context_fmha=False, max_num_tokens=2048, **_NO_SERVE)
    assert settings.max_num_tokens == 4096
    assert "raised to max_input_len" in _decision(decisions, "build.max_num_tokens").reason


def test_opt_num_tokens_clamped_to_max_num_tokens(base):
    settings, decisions = _resolve(base, opt_num_tokens=10_000)
    assert settings.opt_num_tokens == 8192
    _decision(decisions, "build.opt_num_tokens")


def test_large_max_num_tokens_is_a_warning(base):
    _, decisions = _resolve(base, max_num_tokens=32768)
    assert "16384" in _decision(decisions, "build.max_num_tokens", "warning").reason


def test_max_num_tokens_not_a_block_multiple_is_a_warning(base):
    _, decisions = _resolve(base, max_num_tokens=8100)
    assert "multiple of tokens_per_block" in _decision(decisions, "build.max_num_tokens", "warning").reason


def test_prompt_cap_without_chunked_context_is_a_warning(base):
    _, decisions = _resolve(base, max_num_tokens=2048, enable_chunked_context=False)
    assert "min(max_seq_len - 1, max_num_tokens) = 2048" in _decision(decisions, "build.max_num_tokens", "warning").reason


def test_strongly_typed_with_fp8_is_recorded(base):
    _, decisions = _resolve(base)
    assert _decision(decisions, "build_config.strongly_typed", "note").applied is True


def test_weight_only_plugins_are_recorded(base):
    _, decisions = _resolve(base, quant_algo="int8_wo", kv_cache_quant="none", dtype="float16")
    assert _decision(decisions, "plugin_config.weight_only_quant_matmul_plugin", "note").applied == "float16"


def test_nvfp4_enables_its_gemm_plugin(base):
    settings, decisions = _resolve(base, 100, quant_algo="nvfp4")
    assert settings.gemm_plugin == "nvfp4"
    _decision(decisions, "build.plugins.gemm_plugin")


def test_deduced_max_seq_len_is_recorded(base):
    settings, decisions = _resolve(base, max_seq_len=None)
    assert settings.max_seq_len == 131072  # llama3 RoPE: max_position_embeddings is not multiplied
    assert _decision(decisions, "build.max_seq_len", "note").applied == 131072


def test_max_seq_len_beyond_the_model_is_a_warning(base):
    _, decisions = _resolve(base, max_seq_len=200_000)
    _decision(decisions, "build.max_seq_len", "warning")


def test_decisions_print_field_values_and_reason(base):
    _, decisions = _resolve(base, quant_algo="int4_awq", kv_cache_quant="none")
    text = str(_decision(decisions, "build.plugins.use_fused_mlp"))
    assert text.startswith("changed build.plugins.use_fused_mlp true -> false: ")


def test_invalid_compute_capability_is_refused(base):
    with pytest.raises(SpecError, match="compute capability"):
        _resolve(base, 9)


@pytest.mark.parametrize("version", ["1.1.0", "1.0.0"])
def test_older_versions_render_the_same_command(version):
    loaded = load_config(GPU_CONFIGS[0])
    older = plan_trtllm_build(loaded.spec, loaded.model, *_paths(loaded.spec.name), get_version(version))
    assert older.argv == _plan(GPU_CONFIGS[0]).argv


def test_every_yaml_quant_choice_has_a_trtllm_name():
    from pipeline.config.spec import KVCacheQuant, QuantAlgo
    from pipeline.quant_formats import KV_CACHE_FORMATS, WEIGHT_FORMATS

    assert set(WEIGHT_FORMATS) == {a.value for a in QuantAlgo}
    assert set(KV_CACHE_FORMATS) == {k.value for k in KVCacheQuant}


# -- LoRA and speculative decoding --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lora_base() -> BuildRequest:
    loaded = load_config(BUILD_CONFIGS / "llama-3.1-8b-fp8-lora.yaml")
    return request_from_spec(loaded.spec, loaded.model)


@pytest.fixture(scope="module")
def lookahead_base() -> BuildRequest:
    loaded = load_config(BUILD_CONFIGS / "llama-3.1-8b-fp8-lookahead.yaml")
    return request_from_spec(loaded.spec, loaded.model)


def _render(request: BuildRequest, sm: int | None = None):
    return plan_from_request(request, Path("/hf"), Path("/ckpt"), Path("/out"), V121, sm)


def test_default_command_carries_no_lora_or_speculative_flag():
    flags = _flags(_plan(BUILD_CONFIGS / "llama-3.1-8b-fp8.yaml").argv)
    assert not {f for f in flags if f.startswith(("--lora", "--max_lora", "--speculative", "--max_draft"))}


def test_lora_flags_build_config_and_engine_record(lora_base):
    build = _render(lora_base)
    flags = _flags(build.argv)
    adapter = str(REPO / "models" / "llama-3.1-8b-lora-example")
    assert flags["--lora_plugin"] == ["bfloat16"] and flags["--lora_dir"] == [adapter]
    assert flags["--lora_target_modules"] == ["attn_q", "attn_k", "attn_v", "attn_dense"] and flags["--max_lora_rank"] == ["32"]
    assert build.build_config["plugin_config"]["lora_plugin"] == "bfloat16"
    assert build.build_config["lora_config"]["lora_dir"] == [adapter]
    assert build.engine_build_config["lora_config"]["lora_dir"] == ["lora/0"]  # Engine.save copies the adapter there
    validate_argv(build.argv, SCHEMA)


def test_several_adapters_and_modules_validate_against_the_schema(lora_base):
    request = dataclasses.replace(lora_base, lora_dirs=("/adapters/a", "/adapters/b"), lora_target_modules=("attn_qkv", "mlp_gate", "mlp_4h_to_h"))
    build = _render(request)
    assert _flags(build.argv)["--lora_dir"] == ["/adapters/a", "/adapters/b"]
    validate_argv(build.argv, SCHEMA)
    assert "--lora_dir /adapters/a /adapters/b \\\n" in render_script(build)


def test_target_modules_default_to_the_first_adapter(tmp_path):
    from tests.conftest import write_model_config

    write_model_config(tmp_path / "model")
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8, "target_modules": ["v_proj", "q_proj", "down_proj"]}')
    (tmp_path / "cfg.yaml").write_text(
        "name: demo\nmodel:\n  source: model\nbuild:\n  target: engine\n  max_input_len: 256\n  max_seq_len: 512\n"
        "  lora:\n    adapter_dirs: [adapter]\n    max_rank: 8\n"
    )
    loaded = load_config(tmp_path / "cfg.yaml")
    request = request_from_spec(loaded.spec, loaded.model)
    assert request.lora_target_modules == ("attn_v", "attn_q", "mlp_4h_to_h") and request.lora_plugin == "float16"


def test_lora_flags_without_the_plugin_are_an_error(lora_base):
    with pytest.raises(SpecError, match=r"LoRA plugin is disabled \(--lora_plugin disable\).*only with the plugin"):
        _resolve(lora_base, lora_plugin="disable")


def test_lora_plugin_without_target_modules_is_an_error(lora_base):
    with pytest.raises(SpecError, match="build.lora has no target modules"):
        _resolve(lora_base, lora_target_modules=(), lora_dirs=())


@pytest.mark.parametrize("algo, layer", [("int8_sq", "SmoothQuantLinear"), ("nvfp4", "FP4Linear")])
def test_lora_on_layers_without_lora_support_is_an_error(lora_base, algo, layer):
    with pytest.raises(SpecError, match=rf"build.lora cannot be combined with quantize.algo {algo}: TensorRT-LLM's {layer}"):
        _resolve(lora_base, quant_algo=algo, kv_cache_quant="none", **_NO_SERVE)


@pytest.mark.parametrize("algo", ["fp8", "int8_wo", "int4_awq", "w4a8_awq", "none"])
def test_lora_builds_on_layers_with_a_lora_branch(lora_base, algo):
    _resolve(lora_base, quant_algo=algo, kv_cache_quant="none")


def test_lora_dtype_is_recorded_for_the_clients(lora_base):
    _, decisions = _resolve(lora_base)
    note = _decision(decisions, "plugin_config.lora_plugin", "note")
    assert note.applied == "bfloat16" and "lora_weights must be bfloat16" in note.reason and "#791" in note.reason


def test_lookahead_flags_and_engine_record(lookahead_base):
    build = _render(lookahead_base)
    flags = _flags(build.argv)
    assert flags["--speculative_decoding_mode"] == ["lookahead_decoding"] and flags["--max_draft_len"] == ["15"]
    assert build.build_config["speculative_decoding_mode"] == 8 and build.build_config["max_draft_len"] == 15
    assert build.build_config["max_seq_len"] == 8192 and build.engine_build_config["max_seq_len"] == 8192 + 15
    validate_argv(build.argv, SCHEMA)


def test_max_draft_len_needs_a_speculative_mode(lookahead_base):
    with pytest.raises(SpecError, match=r"build.speculative.max_draft_len \(15\) > 0 needs a speculative decoding mode"):
        _resolve(lookahead_base, speculative_decoding_mode=None)


def test_a_speculative_mode_needs_draft_tokens(lookahead_base):
    with pytest.raises(SpecError, match=r"build.speculative.mode lookahead_decoding needs build.speculative.max_draft_len > 0 \(got 0\)"):
        _resolve(lookahead_base, max_draft_len=0)


def test_speculative_decoding_excludes_beam_search(lookahead_base):
    with pytest.raises(SpecError, match=r"cannot be built with build.max_beam_width 4.*never beam_search"):
        _resolve(lookahead_base, max_beam_width=4)


def test_speculative_decoding_needs_the_paged_kv_cache(lookahead_base):
    with pytest.raises(SpecError, match=r"build.speculative.mode lookahead_decoding needs build.kv_cache_type paged \(got continuous\)"):
        _resolve(lookahead_base, kv_cache_type="continuous", **_NO_SERVE)


def test_modes_this_pipeline_cannot_produce_are_errors(lookahead_base):
    with pytest.raises(SpecError, match=r"build.speculative.mode explicit_draft_tokens is not built by this pipeline"):
        _resolve(lookahead_base, speculative_decoding_mode="explicit_draft_tokens")


def test_lookahead_needs_ampere_or_newer(lookahead_base):
    with pytest.raises(SpecError, match=r"lookahead_decoding needs SM >= 8.0 \(Ampere or newer\); the GPU is SM 7.5"):
        _resolve(lookahead_base, 75, quant_algo="none", kv_cache_quant="none")


def test_lookahead_outside_its_support_matrix_is_a_warning(lookahead_base):
    _, decisions = _resolve(lookahead_base, quant_algo="int4_awq", kv_cache_quant="none")
    assert "FP16/BF16/FP8" in _decision(decisions, "build.speculative.mode", "warning").reason


def test_lora_with_speculative_decoding_is_a_warning(lookahead_base, lora_base):
    request = dataclasses.replace(lookahead_base, **{f: getattr(lora_base, f) for f in ("lora_plugin", "lora_dirs", "lora_target_modules", "max_lora_rank")})
    _, decisions = _resolve(request)
    assert "LoRA together with speculative decoding" in _decision(decisions, "build.speculative.mode", "warning").reason


def test_speculative_decoding_raises_max_num_tokens(lookahead_base):
    settings, decisions = _resolve(lookahead_base, max_batch_size=1024)
    assert settings.max_num_tokens == 1024 * 16
    d = _decision(decisions, "build.max_num_tokens")
    assert (d.requested, d.applied) == (8192, 16384) and "max_batch_size × (max_draft_len + 1)" in d.reason


def test_speculative_decoding_lengthens_the_recorded_max_seq_len(lookahead_base):
    _, decisions = _resolve(lookahead_base)
    note = _decision(decisions, "build_config.max_seq_len", "note")
    assert note.applied == 8192 + 15 and "adds max_draft_len (15)" in note.reason


@pytest.mark.parametrize("version", ["1.1.0", "1.0.0"])
def test_every_version_profile_takes_the_lora_and_speculative_flags(version):
    for config in ("llama-3.1-8b-fp8-lora", "llama-3.1-8b-fp8-lookahead"):
        loaded = load_config(BUILD_CONFIGS / f"{config}.yaml")
        older = plan_trtllm_build(loaded.spec, loaded.model, *_paths(loaded.spec.name), get_version(version))
        assert older.argv == _plan(BUILD_CONFIGS / f"{config}.yaml").argv


def test_context_logits_are_a_build_option_recorded_in_the_build_config(lookahead_base):
    build = _render(dataclasses.replace(lookahead_base, speculative_decoding_mode=None, max_draft_len=0, gather_context_logits=True))
    assert build.build_config["gather_context_logits"] is True and build.build_config["gather_generation_logits"] is False
    assert _render(dataclasses.replace(lookahead_base, speculative_decoding_mode=None, max_draft_len=0)).build_config["gather_context_logits"] is False


def test_context_logits_exclude_speculative_decoding(lookahead_base):
    with pytest.raises(SpecError, match=r"build.gather_context_logits cannot be combined with build.speculative"):
        _resolve(lookahead_base, gather_context_logits=True)
