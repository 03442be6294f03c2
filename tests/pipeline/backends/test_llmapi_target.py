"""The llmapi target (TensorRT-LLM's PyTorch backend): every rendered LLM() option against NVIDIA's TorchLlmArgs
as recorded in tests/data/llmapi_1_2_1_llm_args.json, the two forms against NVIDIA's model.yaml reader, llmapi
config.pbtxt and trtllm-serve CLI, goldens of the dry-run rendering, and the bad inputs `validate` refuses."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from types import MappingProxyType

import pytest
import yaml

from pipeline.backends.base import BuildJob
from pipeline.backends.llmapi.forms import LLMAPI_INPUTS, LLMAPI_OUTPUTS
from pipeline.backends.llmapi.options import ROWS, TRITON_ONLY, build_options, flatten, merged_options, serve_options, version_problems
from pipeline.backends.llmapi.versions import SUPPORTED_VERSIONS
from pipeline.backends.registry import backend_for
from pipeline.cli import main
from pipeline.config.loader import load_config
from pipeline.config.spec import Target
from pipeline.deploy.compose.checks import lint_compose
from pipeline.render.pbtxt import parse_config
from tests.conftest import REPO

EXAMPLE = REPO / "build_configs" / "llama-3.1-8b-fp8-llmapi.yaml"
RECORDED = json.loads((REPO / "tests" / "data" / "llmapi_1_2_1_llm_args.json").read_text())
GOLDEN = REPO / "tests" / "golden" / "llmapi"
_TYPES = {"int": int, "float": (int, float), "bool": bool, "str": str, "path": str, "object": dict}


def _fits(option: str, value) -> list[str]:
    field = RECORDED["fields"].get(option)
    if field is None:
        return [f"{option}: not a TorchLlmArgs field"]
    if field["type"].startswith("list["):
        if not isinstance(value, list) or not value:
            return [f"{option}: {value!r} is not a non-empty list"]
        return [p for item in value for p in _fits_item(option, item, field)]
    return _fits_item(option, value, field)


def _fits_item(option: str, value, field: dict) -> list[str]:
    problems = []
    kind = field["type"][len("list[") : -1] if field["type"].startswith("list[") else field["type"]
    if isinstance(value, bool) != (kind == "bool") or not isinstance(value, _TYPES[kind]):
        problems.append(f"{option}: {value!r} is not {field['type']}")
    if "choices" in field and value not in field["choices"]:
        problems.append(f"{option}: {value!r} not in {field['choices']}")
    if "min" in field and value < field["min"] or "max" in field and value > field["max"]:
        problems.append(f"{option}: {value!r} out of [{field.get('min')}, {field.get('max')}]")
    return problems


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> Path:
    """The example's dry run, once: prepare, quantize (scripts only), build (options), package, deploy."""
    store = tmp_path_factory.mktemp("artifacts")
    assert main(["--artifacts", str(store), "run", str(EXAMPLE), "--runner", "dry-run"]) == 0
    return store / "llama-3.1-8b-fp8-llmapi"


def _one(root: Path, pattern: str) -> Path:
    [path] = sorted(root.glob(pattern))
    return path


def test_the_profile_options_are_nvidias_fields_with_their_types():
    for option, kind in SUPPORTED_VERSIONS["1.2.1"].options.items():
        field = RECORDED["fields"][option]
        assert kind.kind == field["type"], option
        assert set(kind.choices) <= set(field.get("choices", kind.choices)), option


def test_every_rendered_option_fits_its_torchllmargs_field():
    loaded = load_config(EXAMPLE, ["build.runner=dry-run"])
    options = merged_options(build_options(loaded.spec, loaded.model), serve_options(loaded.spec.serve))
    problems = [p for option, value in flatten(options).items() for p in _fits(option, value)]
    assert problems == []
    flat = flatten(options)
    assert flat["kv_cache_config.dtype"] == "fp8" and flat["kv_cache_config.free_gpu_memory_fraction"] == 0.9
    assert flat["max_seq_len"] == 8192 and flat["scheduler_config.capacity_scheduler_policy"] == "GUARANTEED_NO_EVICT"


def test_each_spec_field_maps_to_one_option():
    fields = [row.spec_field for row in ROWS]
    options = [row.option for row in ROWS if row.option is not None]
    assert len(fields) == len(set(fields)) and len(options) == len(set(options))
    assert not set(RECORDED["absent"]) & set(options)  # options TorchLlmArgs lacks are never rendered


def test_model_yaml_gives_nvidias_reader_what_it_reads(dry_run):
    document = yaml.safe_load(_one(dry_run, "deploy-*/deploy/model_repository/tensorrt_llm/1/model.yaml").read_text())
    reader = RECORDED["model_yaml_reader"]
    triton = document.pop("triton_config")
    assert set(reader["triton_config_required"]) <= set(triton) <= set(reader["triton_config_required"] + reader["triton_config_optional"])
    assert triton == {"max_batch_size": 0, "decoupled": True}
    assert document["model"] == "/engine" and document["backend"] == "pytorch"
    assert [p for option, value in flatten(document).items() for p in _fits(option, value)] == []


def test_config_pbtxt_declares_nvidias_llmapi_tensors(dry_run):
    text = _one(dry_run, "package-*/model_repository/tensorrt_llm/config.pbtxt").read_text()
    config = parse_config(text, "tensorrt_llm/config.pbtxt")
    recorded = RECORDED["config_pbtxt"]
    assert (config.name, config.backend, config.max_batch_size, config.model_transaction_policy.decoupled) == ("tensorrt_llm", "python", 0, True)
    assert config.instance_group[0].kind == 2  # KIND_CPU: the LLM() workers own the GPUs
    from tritonclient.grpc import model_config_pb2

    def dtype(value):
        return model_config_pb2.DataType.Name(value).replace("TYPE_BYTES", "TYPE_STRING")

    declared_inputs = {t.name: [dtype(t.data_type), t.optional] for t in config.input}
    assert declared_inputs == {name: recorded["inputs"][name] for name in declared_inputs}
    assert "text_input" in declared_inputs and "sampling_param_max_tokens" in declared_inputs
    assert {t.name: dtype(t.data_type) for t in config.output} == {name: recorded["outputs"][name] for name, _, _ in LLMAPI_OUTPUTS}
    assert [name for name, *_ in LLMAPI_INPUTS] == list(declared_inputs)


def test_trtllm_serve_runs_with_recorded_flags_and_the_same_options(dry_run):
    deploy = _one(dry_run, "deploy-*/deploy")
    compose = yaml.safe_load((deploy / "docker-compose.yml").read_text())
    argv = compose["services"]["trtllm-serve"]["command"]
    assert argv[:2] == ["trtllm-serve", "/engine"]
    flags = [token for token in argv[2:] if token.startswith("--")]
    assert set(flags) <= set(RECORDED["trtllm_serve"]["flags"])
    served = yaml.safe_load((deploy / "trtllm_serve" / "extra-llm-api-config.yml").read_text())
    triton = yaml.safe_load((deploy / "model_repository" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert served == {k: v for k, v in triton.items() if k not in ("model", "backend", "triton_config")}


def test_compose_runs_one_form_per_profile_on_the_same_gpus(dry_run):
    deploy = _one(dry_run, "deploy-*/deploy")
    compose = yaml.safe_load((deploy / "docker-compose.yml").read_text())
    triton, serve = compose["services"]["triton"], compose["services"]["trtllm-serve"]
    assert (triton["profiles"], serve["profiles"]) == (["gpu"], ["trtllm-serve"])
    assert triton["image"].endswith("tritonserver:26.02-trtllm-python-py3") and serve["image"] == "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"
    assert triton["deploy"] == serve["deploy"] and serve["ports"] == ["127.0.0.1:9000:8000"]
    assert triton["command"][0] == "tritonserver" and "entrypoint" not in triton  # no engine to check, no mpirun
    assert lint_compose(compose) == []


@pytest.mark.parametrize(
    "golden, pattern",
    [
        ("model.yaml", "deploy-*/deploy/model_repository/tensorrt_llm/1/model.yaml"),
        ("config.pbtxt", "deploy-*/deploy/model_repository/tensorrt_llm/config.pbtxt"),
        ("extra-llm-api-config.yml", "deploy-*/deploy/trtllm_serve/extra-llm-api-config.yml"),
        ("docker-compose.yml", "deploy-*/deploy/docker-compose.yml"),
    ],
)
def test_rendered_files_match_the_goldens(dry_run, golden, pattern):
    text = _one(dry_run, pattern).read_text()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.mkdir(parents=True, exist_ok=True)
        (GOLDEN / golden).write_text(text)
    assert text == (GOLDEN / golden).read_text()


@pytest.mark.parametrize(
    "override, message",
    [
        ("quantize.algo=int8_sq", "quantize.algo int8_sq does not run on build.target llmapi"),
        ("quantize.algo=int8_wo", "quantize.algo int8_wo does not run on build.target llmapi"),
        ("quantize.kv_cache=int8", "quantize.kv_cache int8 does not run on build.target llmapi"),
        (
            "build.gather_context_logits=true",
            "build.gather_context_logits has no LLM() option on build.target llmapi: TorchLlmArgs has no gather_context_logits",
        ),
        ("build.kv_cache_type=continuous", "build.kv_cache_type has no LLM() option on build.target llmapi"),
        ("serve.model_name=llama", "serve.model_name has no LLM() option on build.target llmapi: NVIDIA's llmapi layout has one model"),
        ("build.trtllm_version=1.3.0rc5", "build.trtllm_version '1.3.0rc5' has no profile for build.target llmapi (release candidates are not profiled"),
        ("build.tp_size=3", "build.tp_size (3) must divide the model's number of KV heads (8)"),
        ("build.speculative.mode=lookahead_decoding", "build.speculative.mode lookahead_decoding is refused on build.target llmapi"),
        (
            "build.speculative.draft.max_batch_size=8",
            "build.speculative.draft.max_batch_size has no LLM() option on build.target llmapi: DraftTargetDecodingConfig loads the draft",
        ),
    ],
)
def test_validate_refuses_what_the_pytorch_path_does_not_run(tmp_path, capsys, override, message):
    gpus = ["--set", "deploy.gpus=[0,1,2]"] if override == "build.tp_size=3" else []  # so that only the heads are wrong
    if override.startswith("build.speculative.draft"):  # a complete draft section, so that only the target refuses the limit
        gpus = [
            "--set",
            "build.speculative.mode=draft_tokens_external",
            "--set",
            "build.speculative.max_draft_len=4",
            "--set",
            "build.speculative.draft.source=../models/llama-3.2-1b-instruct",
        ]
    code = main(["--artifacts", str(tmp_path), "validate", str(EXAMPLE), "--set", override, *gpus])
    err = capsys.readouterr().err
    assert code != 0 and message in " ".join(err.split())
    if override.startswith("build.tp_size"):
        assert "build.target llmapi shards the heads" in " ".join(err.split())
    if override.endswith("lookahead_decoding"):
        assert "no lookahead decoding" in " ".join(err.split())
    assert not (tmp_path / "llama-3.1-8b-fp8-llmapi").exists()


def test_an_option_the_chosen_version_lacks_is_refused_naming_field_and_version(tmp_path, capsys, monkeypatch):
    profile = SUPPORTED_VERSIONS["1.2.1"]
    older = dataclasses.replace(
        profile, version="1.2.1", options=MappingProxyType({k: v for k, v in profile.options.items() if k != "kv_cache_config.tokens_per_block"})
    )
    assert version_problems({"kv_cache_config.tokens_per_block": ("build.tokens_per_block", 32)}, older) == [
        (
            "build.tokens_per_block",
            "build.tokens_per_block sets LLM() option kv_cache_config.tokens_per_block, which TensorRT-LLM 1.2.1 does not have (build.target llmapi)",
        )
    ]
    monkeypatch.setattr("pipeline.backends.llmapi.options.get_llmapi_version", lambda version: older)
    assert main(["--artifacts", str(tmp_path), "validate", str(EXAMPLE)]) != 0
    assert "kv_cache_config.tokens_per_block, which TensorRT-LLM 1.2.1 does not have" in " ".join(capsys.readouterr().err.split())


def test_the_build_links_the_unified_checkpoint_and_records_the_options(tmp_path):
    loaded = load_config(EXAMPLE, ["build.runner=local"])
    quantize = tmp_path / "quantize"
    (quantize / "hf_checkpoint").mkdir(parents=True)
    for name, data in (("config.json", b"{}"), ("model.safetensors", b"weights"), ("tokenizer.json", b"{}")):
        (quantize / "hf_checkpoint" / name).write_bytes(data)
    engine = tmp_path / "build" / "engine"
    job = BuildJob(loaded.spec, loaded.model, quantize / "trtllm_checkpoint", engine, engine, log=lambda line: None)
    notes = backend_for(Target.llmapi).build(job)
    assert notes["checkpoint_files"] == 3 and notes["dry_run"] is False
    assert os.stat(engine / "model.safetensors").st_ino == os.stat(quantize / "hf_checkpoint" / "model.safetensors").st_ino
    record = json.loads((engine / "llm_api_options.json").read_text())
    assert record["trtllm_version"] == "1.2.1" and record["options"]["tensor_parallel_size"] == 1


def test_the_capacity_plan_follows_the_pytorch_memory_model(tmp_path, capsys):
    assert main(["--artifacts", str(tmp_path), "plan", str(EXAMPLE), "--gpu", "H200"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "memory model: PyTorch backend" in out and "free_gpu_memory_fraction of the memory still free" in out
    reserve, _ = backend_for(Target.llmapi).capacity_reserve(load_config(EXAMPLE).spec)
    engine_reserve, _ = backend_for(Target.engine).capacity_reserve(load_config(EXAMPLE).spec)
    assert reserve == pytest.approx(engine_reserve + 19 * 0.2)


def test_the_side_by_side_table_names_every_row():
    page = (REPO / "docs" / "targets.md").read_text(encoding="utf-8")
    section = page[page.index("## Engine or llmapi") : page.index("## Model families")]
    fields = [row.spec_field for row in ROWS] + list(TRITON_ONLY)
    assert [field for field in fields if f"`{field}`" not in section] == []


def test_tensor_parallel_runs_one_server_process_whose_llm_starts_the_ranks():
    from pipeline.deploy.compose.document import render_compose

    spec = load_config(EXAMPLE, ["build.tp_size=2", "deploy.gpus=[0,1]"]).spec
    compose = render_compose(spec, model_repository=Path("model_repository"), engine_dir=Path("engine"), target="llmapi")
    triton, serve = compose["services"]["triton"], compose["services"]["trtllm-serve"]
    assert triton["command"][0] == "tritonserver" and "mpirun" not in triton["command"]  # no leader mode: LLM() spawns its MPI workers
    assert (
        triton["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
        == ["0", "1"]
        == (serve["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"])
    )


def test_the_project_clients_speak_the_ensemble_contract_not_the_llmapi_models():
    """Why `infer` / `bench load --endpoint grpc|http` do not drive the Triton form: only text_input is shared."""
    from clients.types import INPUT_DATATYPES

    llmapi_inputs = {name for name, *_ in LLMAPI_INPUTS}
    assert set(INPUT_DATATYPES) & llmapi_inputs == {"text_input"}
    assert "max_tokens" in INPUT_DATATYPES and "sampling_param_max_tokens" in llmapi_inputs


def test_prompt_lookup_renders_nvidias_ngram_speculative_config():
    spec = load_config(
        EXAMPLE, ["build.speculative.mode=prompt_lookup", "build.speculative.max_draft_len=4", "build.speculative.prompt_lookup.max_matching_ngram_size=2"]
    ).spec
    options = build_options(spec, load_config(EXAMPLE).model)
    # NGramDecodingConfig (TensorRT-LLM 1.x llm_args.py): decoding_type "NGram", max_draft_len, max_matching_ngram_size
    assert options["speculative_config"] == {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 2}


@pytest.mark.parametrize("choice, backend", [("xgrammar", "xgrammar"), ("none", None)])
def test_guided_decoding_sets_the_llm_backend_option_or_leaves_it_out(choice, backend):
    spec = load_config(EXAMPLE, [f"serve.guided_decoding={choice}"]).spec
    assert serve_options(spec.serve).get("guided_decoding_backend") == backend


def test_stream_interval_is_the_llm_option_of_the_same_name():
    spec = load_config(EXAMPLE, ["serve.stream_interval=4"]).spec
    assert serve_options(spec.serve)["stream_interval"] == 4
