"""Build-config loading: valid files, every bad input with file:line + field, overrides, schema drift."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from pipeline.cli import main
from pipeline.config.loader import load_config
from pipeline.config.overrides import apply_overrides, parse_override
from pipeline.config.schema import spec_schema_text
from pipeline.config.spec import Spec
from pipeline.errors import SpecError
from tests.conftest import BUILD_CONFIGS, MINIMAL_CONFIG, REPO, write_model_config

VALID = MINIMAL_CONFIG


def write_config(tmp_path: Path, text: str, *, model: bool = True) -> Path:
    if model:
        write_model_config(tmp_path / "model")
    path = tmp_path / "cfg.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def spec_error(path: Path, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(SpecError) as info:
        load_config(path, overrides)
    return info.value.message


@pytest.mark.parametrize("config", sorted(BUILD_CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_build_config_validates(config: Path) -> None:
    if config.name == "tiny-cpu-medusa.yaml" and not (REPO / "models" / "tiny-stdlib-llama-medusa").is_dir():
        pytest.skip(
            "models/tiny-stdlib-llama-medusa (the trained heads) is shipped by another branch of issue #35; "
            "tests/pipeline/backends/test_medusa.py validates this config with random heads"
        )
    loaded = load_config(config)
    assert loaded.spec.name == config.stem
    assert loaded.model.path.is_dir()


def test_gpu_examples_cover_the_documented_models() -> None:
    names = {p.stem for p in BUILD_CONFIGS.glob("*.yaml")}
    assert {"tiny-cpu", "llama-3.1-8b-fp8", "llama-3.1-8b-int4-awq", "llama-3.3-70b-fp8-tp2", "mistral-7b-int8-sq"} <= names
    assert load_config(BUILD_CONFIGS / "llama-3.3-70b-fp8-tp2.yaml").spec.build.tp_size == 2


def test_valid_config_loads_frozen_with_absolute_model_path(tmp_path: Path) -> None:
    loaded = load_config(write_config(tmp_path, VALID))
    assert loaded.spec.model.source == (tmp_path / "model").resolve()
    with pytest.raises(ValidationError):
        loaded.spec.build.max_batch_size = 4  # type: ignore[misc]


def test_unknown_key_names_line_and_suggests(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID + "  max_seq_lne: 12\n")
    message = spec_error(path)
    assert f"{path}:9: build.max_seq_lne: unknown key 'max_seq_lne'; did you mean 'max_seq_len'?" in message


def test_unknown_top_level_section(tmp_path: Path) -> None:
    message = spec_error(write_config(tmp_path, VALID + "serv:\n  streaming: true\n"))
    assert ":9: serv: unknown key 'serv'; did you mean 'serve'?" in message


def test_unknown_key_in_an_optional_section_suggests_too(tmp_path: Path) -> None:
    message = spec_error(write_config(tmp_path, VALID), ("build.speculative.mode=lookahead_decoding", "build.speculative.max_draft_ln=2"))
    assert (
        "build.speculative.max_draft_ln: unknown key 'max_draft_ln'; did you mean 'max_draft_len'? "
        "(valid keys: mode, max_draft_len, lookahead, prompt_lookup, draft, medusa, eagle, mtp, draft_vocab_size)"
    ) in message


@pytest.mark.parametrize(
    "overrides, field",
    [
        (("serve.enable_kv_cache_reuse=true", "quantize.kv_cache=int8", "quantize.calibration.files=[x]"), "serve.enable_kv_cache_reuse"),
        (("quantize.group_size=32",), "quantize.group_size"),
        (("quantize.algo=int4_wo",), "quantize.algo"),
        (("serve.decoupled=false",), "serve.streaming"),
        (("deploy.grpc_port=8000",), "deploy.grpc_port"),
        (("build.tp_size=3",), "build.tp_size"),
        (("build.max_batch_size=0",), "build.max_batch_size"),
        (("model.source=nowhere",), "model.source"),
        (("build.lora.adapter_source=nemo", "build.lora.target_modules=[attn_q]"), "build.lora.adapter_source"),
        (("gate.performance.concurrency=2",), "gate.performance"),
    ],
)
def test_each_problem_names_its_field_once(tmp_path: Path, overrides: tuple[str, ...], field: str) -> None:
    """A message that starts with its field stands alone; the loader prefixes the field to any other (pydantic's own)."""
    message = spec_error(write_config(tmp_path, VALID), overrides)
    problem = message.split(": ", 1)[1]  # after file:line (or --set KEY=VALUE)
    assert problem.startswith(field) and problem.count(field) == 1, message
    assert re.search(r"\b([a-z_]+(?:\.[a-z_]+)+): \1\b", problem) is None, message


def test_wrong_type_names_field_and_value(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID.replace("max_input_len: 256", "max_input_len: lots"))
    message = spec_error(path)
    assert f"{path}:6: build.max_input_len: Input should be a valid integer" in message
    assert "'lots'" in message


def test_unknown_enum_lists_the_choices(tmp_path: Path) -> None:
    message = spec_error(write_config(tmp_path, VALID + "quantize:\n  algo: int3\n"))
    assert ":10: quantize.algo:" in message
    for choice in ("none", "fp8", "int8_sq", "int8_wo", "int4_awq", "w4a8_awq", "nvfp4"):
        assert repr(choice) in message


def test_duplicate_key_is_refused_with_both_lines(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID + "  max_input_len: 128\n")
    message = spec_error(path)
    assert f"{path}:9: duplicate key 'build.max_input_len' (first set on line 6)" in message


def test_missing_required_field(tmp_path: Path) -> None:
    message = spec_error(write_config(tmp_path, "name: demo\nmodel:\n  source: model\n"))
    assert "build: required field is missing" in message
    message = spec_error(write_config(tmp_path, "name: demo\nmodel:\n  dtype: float16\nbuild:\n  target: cpu\n"))
    assert ":2: model.source: required field is missing" in message


def test_max_input_len_must_be_below_max_seq_len_naming_both(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID.replace("max_input_len: 256", "max_input_len: 512"))
    message = spec_error(path)
    assert f"{path}:6: build.max_input_len (512) must be less than build.max_seq_len (512)" in message


def test_max_input_len_checked_against_deduced_max_seq_len(tmp_path: Path) -> None:
    text = VALID.replace("  max_seq_len: 512\n", "").replace("max_input_len: 256", "max_input_len: 1024")
    message = spec_error(write_config(tmp_path, text))
    assert "build.max_input_len (1024) must be less than build.max_seq_len (1024, deduced from max_position_embeddings" in message


@pytest.mark.parametrize("value", [8, 24, 256, 0])
def test_tokens_per_block_power_of_two_in_range(tmp_path: Path, value: int) -> None:
    message = spec_error(write_config(tmp_path, VALID + f"  tokens_per_block: {value}\n"))
    assert ":9: build.tokens_per_block must be a power of two in 16..128" in message


def test_tp_size_must_divide_kv_heads(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID + "  tp_size: 3\n")  # the model has 2 KV heads, 4 attention heads
    message = spec_error(path)
    assert f"{path}:9: build.tp_size (3) must divide the model's number of KV heads (2)" in message
    load_config(path, ("build.tp_size=4",))  # 2 KV heads replicated over 4 ranks is allowed


def test_model_path_that_does_not_exist(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID.replace("source: model", "source: nowhere"), model=False)
    message = spec_error(path)
    assert f"{path}:3: model.source: model directory not found: {tmp_path / 'nowhere'}" in message


@pytest.mark.parametrize("suffix", [".bin", ".pt"])
def test_pickled_only_checkpoint_is_refused(tmp_path: Path, suffix: str) -> None:
    path = write_config(tmp_path, VALID)
    (tmp_path / "model" / f"pytorch_model{suffix}").write_bytes(b"\x80\x04not really a pickle")
    message = spec_error(path)
    assert f"{path}:3: model.source:" in message
    assert "only pickled weights" in message and "safetensors" in message


def test_unsupported_architecture(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID, model=False)
    write_model_config(tmp_path / "model", model_type="gpt2", architectures=["GPT2LMHeadModel"])
    message = spec_error(path)
    assert "config.json: model_type 'gpt2' (GPT2LMHeadModel) is not a family this tool knows; known: llama, mistral" in message


def test_cross_section_rule_names_both_fields(tmp_path: Path) -> None:
    text = VALID + "  plugins:\n    use_paged_context_fmha: false\n"
    message = spec_error(write_config(tmp_path, text))
    assert "serve.enable_kv_cache_reuse: true needs build.plugins.use_paged_context_fmha: true" in message


def test_streaming_needs_decoupled(tmp_path: Path) -> None:
    message = spec_error(write_config(tmp_path, VALID + "serve:\n  decoupled: false\n"))
    assert "serve.streaming: true requires serve.decoupled: true" in message


def test_invalid_yaml_reports_line(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID + "  bad: [unclosed\n")
    assert spec_error(path).startswith(f"{path}:")


def test_set_overrides_apply_and_are_located(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID)
    loaded = load_config(path, ("build.max_seq_len=1000", "serve.streaming=false", "quantize.calibration.seed=3"))
    assert loaded.spec.build.max_seq_len == 1000
    assert loaded.spec.serve.streaming is False
    assert loaded.spec.quantize.calibration.seed == 3
    message = spec_error(path, ("build.max_input_len=600",))
    assert message.startswith("--set build.max_input_len=600: build.max_input_len (600) must be less than")


@pytest.mark.parametrize("text", ["build.max_seq_len", "=3", "build..x=1", "build.max seq=1", "a.b=[1,", "a.b={x: 1}"])
def test_unparsable_set_is_a_spec_error(text: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_override(text)
    assert info.value.message.startswith(f"--set {text!r}")


def test_apply_overrides_is_pure() -> None:
    data = {"build": {"max_seq_len": 1}}
    result = apply_overrides(data, [parse_override("build.max_seq_len=2"), parse_override("serve.streaming=no")])
    assert data == {"build": {"max_seq_len": 1}}
    assert result == {"build": {"max_seq_len": 2}, "serve": {"streaming": False}}
    with pytest.raises(SpecError, match="build.max_seq_len is a value, not a section"):
        apply_overrides(data, [parse_override("build.max_seq_len.x=1")])


def test_every_field_is_described() -> None:
    from pipeline.config.spec.strict import section_model

    seen: list[str] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            assert field.description, f"{prefix}{name} has no description"
            seen.append(f"{prefix}{name}")
            section = section_model(field.annotation)  # `Model` or an optional `Model | None` section
            if section is not None:
                walk(section, f"{prefix}{name}.")

    walk(Spec, "")
    assert {"build.lora.max_rank", "build.speculative.lookahead.window_size", "serve.lora.cache_max_adapter_size"} <= set(seen)


def test_schema_json_is_up_to_date() -> None:
    committed = (REPO / "build_configs" / "schema.json").read_text()
    assert committed == spec_schema_text(), "build_configs/schema.json is stale: run `make schema`"


def test_cli_exit_code_2_and_no_artifacts_on_spec_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, VALID + "  tp_size: 3\n")
    store = tmp_path / "artifacts"
    for command in ("validate", "plan", "run", "status"):
        assert main(["--artifacts", str(store), command, str(path)]) == 2
        err = capsys.readouterr().err
        assert f"error: {path}:9: build.tp_size" in err
        assert "hint:" in err
    assert main(["--artifacts", str(store), "run", str(path), "--set", "build.oops"]) == 2
    assert "--set 'build.oops'" in capsys.readouterr().err
    assert not store.exists()


def test_cli_validate_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(write_config(tmp_path, VALID))]) == 0
    assert "valid" in capsys.readouterr().out


def test_schema_lists_enums() -> None:
    schema = json.loads(spec_schema_text())
    assert schema["$defs"]["QuantAlgo"]["enum"] == ["none", "fp8", "int8_sq", "int8_wo", "int4_awq", "w4a8_awq", "nvfp4"]
    assert schema["additionalProperties"] is False


def test_the_reference_page_is_up_to_date() -> None:
    from pipeline.config.reference import config_reference_markdown

    page = (REPO / "docs" / "reference.md").read_text(encoding="utf-8")
    assert config_reference_markdown() in page, "docs/reference.md is stale: run `make schema`"


# -- build.lora / build.speculative / serve.lora -------------------------------------------------------------
ENGINE = VALID.replace("target: cpu", "target: engine")
LORA_SECTION = "  lora:\n    adapter_dirs: [adapter]\n    max_rank: 16\n"  # starts on line 9
LOOKAHEAD_SECTION = "  speculative:\n    mode: lookahead_decoding\n"


def write_adapter(directory: Path, **config) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    values = {"peft_type": "LORA", "r": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], **config}
    (directory / "adapter_config.json").write_text(json.dumps(values))
    return directory


def test_lora_and_lookahead_configs_load(tmp_path: Path) -> None:
    write_adapter(tmp_path / "adapter")
    loaded = load_config(write_config(tmp_path, ENGINE + LORA_SECTION + LOOKAHEAD_SECTION))
    assert loaded.spec.build.lora.adapter_dirs == (str((tmp_path / "adapter").resolve()),)  # relative to the YAML file
    assert loaded.spec.build.speculative.draft_len == 15  # (W 4, N 3, G 4), TensorRT-LLM's defaults


def test_lookahead_is_refused_on_the_cpu_target(tmp_path: Path) -> None:
    """The cpu target speculates with a draft model or prompt lookup (refengine), not with lookahead decoding."""
    message = spec_error(write_config(tmp_path, VALID + LOOKAHEAD_SECTION))
    assert "build.speculative.mode lookahead_decoding is refused on build.target cpu: the reference engine" in message
    assert "(target engine builds it)" in message


def test_lora_loads_on_the_cpu_target_and_a_target_without_it_is_refused_by_its_trait(tmp_path: Path, monkeypatch) -> None:
    from dataclasses import replace

    from pipeline.config.targets import TARGET_TRAITS, Target

    write_adapter(tmp_path / "adapter")
    path = write_config(tmp_path, VALID + LORA_SECTION)
    assert load_config(path).spec.build.lora.max_rank == 16
    monkeypatch.setitem(TARGET_TRAITS, Target.cpu, replace(TARGET_TRAITS[Target.cpu], no_lora_because="it has no LoRA"))
    message = spec_error(path)
    assert f"{path}:9: build.lora is set, but build.target is cpu: it has no LoRA; use target engine or llmapi or remove build.lora" in message


def test_speculative_modes_this_pipeline_cannot_produce(tmp_path: Path) -> None:
    path = write_config(tmp_path, ENGINE + "  speculative:\n    mode: explicit_draft_tokens\n")
    message = spec_error(path)
    assert f"{path}:10: build.speculative.mode explicit_draft_tokens is refused: it " in message
    assert "cannot produce" in message


@pytest.mark.parametrize(
    "mode, section", [("medusa", "the Medusa heads directory"), ("eagle", "the EAGLE draft checkpoint directory (heads): EAGLE-3 on target llmapi")]
)
def test_head_based_modes_need_their_heads(tmp_path: Path, mode: str, section: str) -> None:
    path = write_config(tmp_path, ENGINE + f"  speculative:\n    mode: {mode}\n    max_draft_len: 4\n")
    assert f"build.speculative.{mode} is required for mode {mode}: {section}" in spec_error(path)


def test_lookahead_max_draft_len_must_match_its_window(tmp_path: Path) -> None:
    path = write_config(tmp_path, ENGINE + LOOKAHEAD_SECTION + "    max_draft_len: 16\n")
    message = spec_error(path)
    assert f"{path}:11: build.speculative.max_draft_len (16) must equal" in message
    assert "(W 4, N 3, G 4) = 15" in message
    load_config(path, ("build.speculative.max_draft_len=15",))


@pytest.mark.parametrize(
    "w, n, g, where, fragment",
    [
        (2, 1, 0, "13: build.speculative.lookahead.ngram_size", "ngram_size 1 needs window_size 1 and verification_set_size 0"),
        (1, 1, 0, "11: build.speculative.lookahead", "(1, 1, 0) decodes one token per step"),
    ],
)
def test_illegal_lookahead_configurations(tmp_path: Path, w: int, n: int, g: int, where: str, fragment: str) -> None:
    section = LOOKAHEAD_SECTION + f"    lookahead:\n      window_size: {w}\n      ngram_size: {n}\n      verification_set_size: {g}\n"
    path = write_config(tmp_path, ENGINE + section)
    message = spec_error(path)
    assert f"{path}:{where} " in message and fragment in message


def test_nemo_adapters_are_refused(tmp_path: Path) -> None:
    write_adapter(tmp_path / "adapter")
    path = write_config(tmp_path, ENGINE + LORA_SECTION + "    adapter_source: nemo\n")
    assert f"{path}:12: build.lora.adapter_source nemo is refused: a .nemo LoRA archive holds pickled" in spec_error(path)


def test_lora_needs_modules_or_an_adapter(tmp_path: Path) -> None:
    path = write_config(tmp_path, ENGINE + "  lora:\n    max_rank: 8\n")
    message = spec_error(path)
    assert f"{path}:9: build.lora.target_modules is empty and build.lora.adapter_dirs lists no adapter" in message


def test_unknown_lora_module_lists_the_module_ids(tmp_path: Path) -> None:
    path = write_config(tmp_path, ENGINE + "  lora:\n    target_modules: [attn_q, q_proj]\n")
    message = spec_error(path)
    assert f"{path}:10: build.lora.target_modules.1:" in message and "'mlp_4h_to_h'" in message and "'q_proj'" in message


@pytest.mark.parametrize(
    "adapter, fragment",
    [
        ({"r": 32}, "the adapter's rank r = 32"),
        ({"target_modules": ["q_proj", "gate_proj"]}, "the adapter trains mlp_h_to_4h"),
        ({"target_modules": ".*proj"}, "target_modules is the pattern '.*proj'"),
        ({"target_modules": ["lm_head"]}, "target_modules lm_head have no TensorRT-LLM LoRA module"),
        ({"peft_type": "PREFIX_TUNING"}, "peft_type PREFIX_TUNING is not LORA"),
        ({"use_dora": True}, "DoRA adapters need trtllm-build's dora_plugin"),
    ],
)
def test_adapter_problems_name_the_adapter_entry(tmp_path: Path, adapter: dict, fragment: str) -> None:
    write_adapter(tmp_path / "adapter", **adapter)
    path = write_config(tmp_path, ENGINE + LORA_SECTION + "    target_modules: [attn_q, attn_k, attn_v, attn_dense]\n")
    message = spec_error(path)
    assert f"{path}:10: build.lora.adapter_dirs.0:" in message and fragment in message


def test_missing_and_pickled_adapters(tmp_path: Path) -> None:
    path = write_config(tmp_path, ENGINE + LORA_SECTION)
    assert f"{path}:10: build.lora.adapter_dirs.0: LoRA adapter directory not found: {(tmp_path / 'adapter').resolve()}" in spec_error(path)
    (write_adapter(tmp_path / "adapter") / "adapter_model.bin").write_bytes(b"")
    assert "holds only adapter_model.bin (pickled" in spec_error(path)


def test_serve_lora_needs_build_lora_and_room_for_its_ranks(tmp_path: Path) -> None:
    path = write_config(tmp_path, ENGINE + "serve:\n  lora:\n    cache_optimal_adapter_size: 8\n")
    assert f"{path}:10: serve.lora is set, but build.lora is not" in spec_error(path)
    write_adapter(tmp_path / "adapter")
    path = write_config(tmp_path, ENGINE + LORA_SECTION + "serve:\n  lora:\n    cache_max_adapter_size: 8\n")
    message = spec_error(path)
    assert f"{path}:14: serve.lora.cache_max_adapter_size (8) is below build.lora.max_rank (16)" in message


@pytest.mark.parametrize(
    "interval, message",
    [
        ("4", "serve.stream_interval: 4 cannot be served on build.target engine: the tensorrtllm C++ backend sends one response"),
        ("0", "serve.stream_interval: Input should be greater than or equal to 1"),
    ],
)
def test_stream_interval_is_refused_where_no_server_honours_it(tmp_path: Path, interval: str, message: str) -> None:
    """The engine target's C++ backend streams every token (no stream_interval parameter); below 1 means nothing."""
    assert message in spec_error(write_config(tmp_path, ENGINE + f"serve:\n  stream_interval: {interval}\n"))
