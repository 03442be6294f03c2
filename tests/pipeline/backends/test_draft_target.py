"""Draft-target and prompt-lookup speculative decoding in the spec, the plan and the builds of both targets.

The engine target cannot build here (no GPU, no TensorRT-LLM): its two trtllm-build commands are checked against
NVIDIA's own 1.2.1 argument parser (tests/data) and golden files, its repository against Triton's schema through the
renderer's checks and a golden file. The cpu target's build writes the draft's engine directory for real.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

import pytest

from pipeline.backends.base import BuildJob
from pipeline.backends.cpu.target import BACKEND as CPU
from pipeline.backends.engine.trtllm_build import plan_trtllm_build, render_script
from pipeline.config.loader import load_config
from pipeline.config.model_info import read_model_info
from pipeline.config.spec.draft import draft_spec
from pipeline.errors import SpecError
from pipeline.plan import EnvFacts, plan
from pipeline.render import RepositoryRequest, render_model_repository
from pipeline.render.repository import ConfigPaths
from pipeline.trtllm_versions import get_version
from tests.conftest import BUILD_CONFIGS, REPO
from tests.pipeline.backends.test_trtllm_build import SCHEMA, validate_argv

CPU_DRAFT = BUILD_CONFIGS / "tiny-cpu-draft-target.yaml"
CPU_NGRAM = BUILD_CONFIGS / "tiny-cpu-prompt-lookup.yaml"
ENGINE_DRAFT = BUILD_CONFIGS / "llama-3.1-8b-fp8-draft-target.yaml"
GOLDEN_BUILD = REPO / "tests" / "golden" / "trtllm_build"
GOLDEN_REPO = REPO / "tests" / "golden" / "model_repo_engine_draft_target"
V121 = get_version("1.2.1")


def _refused(path: Path, *overrides: str) -> str:
    with pytest.raises(SpecError) as info:
        load_config(path, overrides)
    return info.value.message


# -- bad inputs, refused at validate, naming the field ---------------------------------------------------
REFUSED = {
    "max_draft_len 0": (CPU_DRAFT, ("build.speculative.max_draft_len=0",), "build.speculative.max_draft_len: Input should be greater than or equal to 1"),
    "max_draft_len above the cap": (CPU_DRAFT, ("build.speculative.max_draft_len=257",), "build.speculative.max_draft_len (257) exceeds 256"),
    "max_draft_len missing": (CPU_NGRAM, ("build.speculative.max_draft_len=null",), "build.speculative.max_draft_len is required for mode prompt_lookup"),
    "draft with prompt_lookup": (CPU_DRAFT, ("build.speculative.mode=prompt_lookup",), "build.speculative.draft applies to mode draft_tokens_external only"),
    "prompt_lookup with a draft": (
        CPU_DRAFT,
        ("build.speculative.prompt_lookup.max_matching_ngram_size=2",),
        "build.speculative.prompt_lookup applies to mode prompt_lookup only",
    ),
    "draft missing": (CPU_DRAFT, ("build.speculative.draft=null",), "build.speculative.draft is required for mode draft_tokens_external"),
    "another vocabulary": (
        CPU_DRAFT,
        (f"build.speculative.draft.source={REPO}/models/llama-3.2-1b-instruct",),
        "build.speculative.draft.source: the draft's vocab_size (128256",
    ),
    "a draft too short": (
        CPU_DRAFT,
        ("build.speculative.draft.max_seq_len=1027",),
        "build.speculative.draft.max_seq_len (1027) must hold build.max_seq_len (1024) + build.speculative.max_draft_len (4) = 1028",
    ),
    "a draft too short for the deduced max_seq_len": (
        CPU_DRAFT,
        ("build.max_seq_len=null", "build.max_input_len=100", "build.speculative.draft.max_seq_len=200"),
        "build.speculative.draft.max_seq_len (200) must hold the model's max_seq_len",
    ),
    "beams": (CPU_DRAFT, ("build.max_beam_width=2",), "build.max_beam_width (2) must be 1 with build.speculative"),
    "prompt lookup on the engine": (
        CPU_NGRAM,
        ("build.target=engine", "build.runner=dry-run"),
        "build.speculative.mode prompt_lookup is refused on build.target engine: TensorRT-LLM 1.2 drafts",
    ),
    "no KV-cache reuse": (
        ENGINE_DRAFT,
        ("serve.enable_kv_cache_reuse=false",),
        "serve.enable_kv_cache_reuse must be true with build.speculative.mode draft_tokens_external",
    ),
    "a draft format the target cannot run": (
        CPU_DRAFT,
        ("build.speculative.draft.quantize.algo=nvfp4",),
        "build.speculative.draft: as a model of its own, quantize.algo nvfp4",
    ),
    "draft_vocab_size 0": (
        CPU_DRAFT,
        ("build.speculative.draft_vocab_size=0",),
        "build.speculative.draft_vocab_size: Input should be greater than or equal to 1",
    ),
    "draft_vocab_size above the draft's vocabulary": (
        CPU_DRAFT,
        ("build.speculative.draft_vocab_size=5000",),
        "build.speculative.draft_vocab_size (5000) exceeds the draft's vocab_size (4096",
    ),
    "draft_vocab_size with prompt_lookup": (
        CPU_NGRAM,
        ("build.speculative.draft_vocab_size=1024",),
        "build.speculative.draft_vocab_size applies to mode draft_tokens_external only",
    ),
    "draft_vocab_size on the engine": (
        ENGINE_DRAFT,
        ("build.speculative.draft_vocab_size=1024",),
        "build.speculative.draft_vocab_size is refused on build.target engine: TensorRT-LLM 1.2's draft-target has no",
    ),
    "draft_vocab_size on llmapi": (
        ENGINE_DRAFT,
        ("build.target=llmapi", "build.speculative.draft_vocab_size=1024"),
        "build.speculative.draft_vocab_size is refused on build.target llmapi: TensorRT-LLM 1.2's draft-target has no",
    ),
    "context logits": (ENGINE_DRAFT, ("build.gather_context_logits=true",), "build.gather_context_logits: true cannot be combined with build.speculative"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_bad_speculative_inputs_are_refused_at_validate(case):
    path, overrides, message = REFUSED[case]
    assert message in _refused(path, *overrides)


def test_lora_with_a_draft_model_is_refused():
    lora = BUILD_CONFIGS / "llama-3.1-8b-fp8-lora.yaml"
    message = _refused(
        lora,
        "build.speculative.mode=draft_tokens_external",
        "build.speculative.max_draft_len=4",
        f"build.speculative.draft.source={REPO}/models/llama-3.2-1b-instruct",
    )
    assert "build.lora cannot be combined with build.speculative.mode draft_tokens_external" in message


def test_paged_context_fmha_off_is_refused_by_the_engine_build():
    message = _refused(ENGINE_DRAFT, "build.plugins.use_paged_context_fmha=false", "serve.enable_kv_cache_reuse=true", "serve.enable_chunked_context=false")
    assert "use_paged_context_fmha" in message


# -- the draft's spec and the plan ----------------------------------------------------------------------
def test_the_draft_spec_defaults_to_the_models_sections():
    spec = load_config(ENGINE_DRAFT).spec
    draft = draft_spec(spec)
    assert draft.name == "llama-3.1-8b-fp8-draft-target-draft" and draft.build.speculative is None
    assert draft.model.dtype == spec.model.dtype and draft.quantize.algo.value == "fp8" and draft.quantize.calibration == spec.quantize.calibration
    assert (draft.build.max_batch_size, draft.build.max_input_len, draft.build.max_num_tokens) == (16, 4096, 8192)
    assert draft.build.max_seq_len == 8192 + 8  # the target's sequences plus a draft


def test_the_draft_stage_is_planned_and_hashes_what_the_draft_reads():
    facts = EnvFacts(tools={}, model_fingerprint="m", draft_fingerprint="d")
    base = plan(load_config(CPU_DRAFT).spec, facts)
    assert base.names() == ("prepare", "quantize", "draft", "build", "package", "deploy")
    assert base.stage("build").upstream["draft"] == base.stage("draft").digest
    other_draft = plan(load_config(CPU_DRAFT).spec, EnvFacts(tools={}, model_fingerprint="m", draft_fingerprint="e"))
    assert other_draft.stage("draft").digest != base.stage("draft").digest
    assert other_draft.stage("quantize").digest == base.stage("quantize").digest
    quantized = plan(load_config(CPU_DRAFT, ["build.speculative.draft.quantize.algo=int8_wo"]).spec, facts)
    assert quantized.stage("draft").digest != base.stage("draft").digest and quantized.stage("quantize").digest == base.stage("quantize").digest
    assert "draft" not in plan(load_config(CPU_NGRAM).spec, facts).names()


# -- engine target: both trtllm-build commands ------------------------------------------------------------
def _engine_builds():
    loaded = load_config(ENGINE_DRAFT)
    draft = draft_spec(loaded.spec)
    target = plan_trtllm_build(loaded.spec, loaded.model, Path("/artifacts/t/quantize/trtllm_checkpoint"), Path("/artifacts/t/build/engine"), V121, 90)
    drafted = plan_trtllm_build(
        draft, read_model_info(draft.model.source), Path("/artifacts/t/draft/trtllm_checkpoint"), Path("/artifacts/t/draft/engine"), V121, 90
    )
    return target, drafted


def test_both_commands_pass_nvidias_parser_and_say_what_draft_target_needs():
    target, draft = _engine_builds()
    for build in (target, draft):
        validate_argv(build.argv, SCHEMA)
        assert build.build_config["plugin_config"]["use_paged_context_fmha"] is True
    argv = " ".join(target.argv)
    assert "--speculative_decoding_mode draft_tokens_external" in argv and "--max_draft_len 8" in argv
    assert target.build_config["speculative_decoding_mode"] == 2 and target.engine_build_config["max_seq_len"] == 8200
    # examples/draft_target_model: the draft is a plain engine (no speculative flags), long enough for the target's sequences
    assert "--speculative_decoding_mode" not in draft.argv and draft.build_config["max_draft_len"] == 0
    assert draft.build_config["max_seq_len"] == 8200 and draft.build_config["max_beam_width"] == 1


def test_the_draft_command_matches_its_golden_file():
    _, draft = _engine_builds()
    script = render_script(draft)
    golden = GOLDEN_BUILD / f"{ENGINE_DRAFT.stem}.draft.sh"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(script)
        pytest.skip(f"golden file rewritten: {golden}")
    assert script == golden.read_text(), "".join(difflib.unified_diff(golden.read_text().splitlines(True), script.splitlines(True)))


# -- engine target: the repository ---------------------------------------------------------------------------
def _engine_dir(directory: Path, build) -> Path:
    directory.mkdir(parents=True)
    config = {
        "version": "1.2.1",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "bfloat16",
            "logits_dtype": "float32",
            "vocab_size": 128256,
            "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
            "quantization": build.quantization,
        },
        "build_config": build.engine_build_config,
    }
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "rank0.engine").write_bytes(b"")
    return directory


@pytest.fixture(scope="module")
def engine_repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("draft-target")
    target, draft = _engine_builds()
    spec = load_config(ENGINE_DRAFT).spec
    out = root / "repository"
    render_model_repository(
        RepositoryRequest(
            engine_dir=_engine_dir(root / "engine", target),
            tokenizer_dir=REPO / "models" / "tiny-stdlib-llama-tokenizer-absent",
            serve=spec.serve,
            target="engine",
            out_dir=out,
            gpu_device_ids=(0,),
            dry_run=True,
            speculative=spec.build.speculative,
            draft_engine_dir=_engine_dir(root / "draft", draft),
            draft_config_dir="/draft_engine",
            config_paths=ConfigPaths("/engine", "/tokenizer", "/models"),  # as the deployment's container sees them
        )
    )
    return out


def test_the_repository_has_two_llm_models_and_a_bls_wired_to_the_draft(engine_repository):
    from pipeline.render.pbtxt import parse_config

    draft = parse_config((engine_repository / "tensorrt_llm_draft" / "config.pbtxt").read_text(), "draft")
    assert draft.backend == "tensorrtllm" and draft.parameters["gpt_model_path"].string_value == "/draft_engine"
    assert draft.parameters["enable_kv_cache_reuse"].string_value == "true"
    bls = parse_config((engine_repository / "tensorrt_llm_bls" / "config.pbtxt").read_text(), "bls")
    assert bls.parameters["tensorrt_llm_draft_model_name"].string_value == "tensorrt_llm_draft"
    assert bls.parameters["max_draft_len"].string_value == "8"
    assert {"num_draft_tokens", "use_draft_logits"} <= {tensor.name for tensor in bls.input}
    target = parse_config((engine_repository / "tensorrt_llm" / "config.pbtxt").read_text(), "target")
    assert "draft_input_ids" in {tensor.name for tensor in target.input}


def test_the_repository_matches_its_golden_files(engine_repository):
    rendered = {str(p.relative_to(engine_repository)): p.read_text() for p in sorted(engine_repository.glob("*/config.pbtxt"))}
    if os.environ.get("UPDATE_GOLDEN") == "1":
        for name, text in rendered.items():
            (GOLDEN_REPO / name).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN_REPO / name).write_text(text)
        pytest.skip(f"golden files rewritten in {GOLDEN_REPO}")
    golden = {str(p.relative_to(GOLDEN_REPO)): p.read_text() for p in sorted(GOLDEN_REPO.glob("*/config.pbtxt"))}
    assert sorted(golden) == sorted(rendered)
    for name, text in rendered.items():
        assert text == golden[name], "".join(difflib.unified_diff(golden[name].splitlines(True), text.splitlines(True), name, name))


def test_a_draft_with_another_vocabulary_is_refused_by_the_checks(tmp_path):
    from pipeline.errors import StageError

    target, draft = _engine_builds()
    draft_dir = _engine_dir(tmp_path / "draft", draft)
    config = json.loads((draft_dir / "config.json").read_text())
    config["pretrained_config"]["vocab_size"] = 32000
    (draft_dir / "config.json").write_text(json.dumps(config))
    spec = load_config(ENGINE_DRAFT).spec
    with pytest.raises(StageError, match="the draft engine's pretrained_config.vocab_size is 32000 but the engine's is 128256"):
        render_model_repository(
            RepositoryRequest(
                engine_dir=_engine_dir(tmp_path / "engine", target),
                tokenizer_dir=tmp_path,
                serve=spec.serve,
                target="engine",
                out_dir=tmp_path / "out",
                dry_run=True,
                speculative=spec.build.speculative,
                draft_engine_dir=draft_dir,
            )
        )


# -- cpu target: the engine directory carries the draft -------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A tiny TensorRT-LLM checkpoint written by hand with the documented tensor names (no torch, no ModelOpt)."""
    import numpy as np
    from safetensors.numpy import save_file

    config = {
        "architecture": "LlamaForCausalLM",
        "dtype": "float16",
        "logits_dtype": "float32",
        "vocab_size": 64,
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 48,
        "hidden_act": "silu",
        "norm_epsilon": 1e-5,
        "position_embedding_type": "rope_gpt_neox",
        "max_position_embeddings": 2048,
        "rotary_base": 10000.0,
        "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
    }
    rng = np.random.default_rng(0)

    def weight(*shape):
        return (0.1 * rng.standard_normal(shape)).astype(np.float16)

    prefix = "transformer.layers.0."
    tensors = {
        "transformer.vocab_embedding.weight": weight(64, 32),
        "transformer.ln_f.weight": np.ones(32, np.float16),
        "lm_head.weight": weight(64, 32),
        prefix + "input_layernorm.weight": np.ones(32, np.float16),
        prefix + "post_layernorm.weight": np.ones(32, np.float16),
        prefix + "attention.qkv.weight": weight(64, 32),
        prefix + "attention.dense.weight": weight(32, 32),
        prefix + "mlp.fc.weight": weight(48, 32),
        prefix + "mlp.gate.weight": weight(48, 32),
        prefix + "mlp.proj.weight": weight(32, 48),
    }
    out = tmp_path_factory.mktemp("checkpoint")
    (out / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(out / "rank0.safetensors"))
    return out


def _cpu_build(path: Path, checkpoint: Path, out: Path, draft_engine_dir: Path | None = None, overrides: tuple[str, ...] = ()) -> Path:
    loaded = load_config(path, overrides)
    engine = out / "engine"
    CPU.build(BuildJob(loaded.spec, loaded.model, checkpoint, engine, engine, log=lambda message: None, draft_engine_dir=draft_engine_dir))
    return engine


def test_the_cpu_build_writes_the_draft_engine_and_the_refengine_contract(tiny_checkpoint, tmp_path):
    spec = load_config(CPU_DRAFT).spec
    draft = draft_spec(spec)
    draft_engine = tmp_path / "draft-stage" / "engine"
    CPU.build(BuildJob(draft, read_model_info(draft.model.source), tiny_checkpoint, draft_engine, draft_engine, log=lambda m: None))
    engine = _cpu_build(CPU_DRAFT, tiny_checkpoint, tmp_path / "build", draft_engine)
    config = json.loads((engine / "config.json").read_text())
    assert config["refengine_speculative"] == {"kind": "draft_model", "max_draft_len": 4, "draft_engine_dir": "draft"}
    assert config["build_config"]["max_draft_len"] == 4 and config["build_config"]["speculative_decoding_mode"] == 2
    assert config["build_config"]["max_seq_len"] == 1028  # trtllm-build's: max_seq_len + max_draft_len
    carried = json.loads((engine / "draft" / "config.json").read_text())
    assert carried["build_config"]["max_seq_len"] >= 1028 and carried["build_config"]["speculative_decoding_mode"] == 1
    assert (engine / "draft" / "rank0.safetensors").is_file() and "refengine_speculative" not in carried
    from refengine import LLMEngine, SamplingParams

    # refengine serves what the cpu build wrote (the draft holds the target's max_seq_len, K included)
    [output] = LLMEngine.from_engine_dir(engine).generate([[1, 2, 3]], SamplingParams(max_tokens=6, temperature=0))
    assert output.metrics.total_draft_tokens > 0


def test_the_cpu_build_writes_the_specs_draft_vocab_size(tiny_checkpoint, tmp_path):
    draft_engine = tmp_path / "draft-stage" / "engine"
    draft = draft_spec(load_config(CPU_DRAFT).spec)
    CPU.build(BuildJob(draft, read_model_info(draft.model.source), tiny_checkpoint, draft_engine, draft_engine, log=lambda m: None))
    engine = _cpu_build(CPU_DRAFT, tiny_checkpoint, tmp_path / "build", draft_engine, ("build.speculative.draft_vocab_size=32",))
    record = json.loads((engine / "config.json").read_text())["refengine_speculative"]
    assert record == {"kind": "draft_model", "max_draft_len": 4, "draft_engine_dir": "draft", "draft_vocab_size": 32}
    from refengine import LLMEngine, SamplingParams
    from refengine.checkpoint import load_engine_dir
    from refengine.speculative.loading import speculative_settings

    assert speculative_settings(load_engine_dir(engine)).draft_vocab_size == 32  # what refengine reads from it
    [output] = LLMEngine.from_engine_dir(engine).generate([[1, 2, 3]], SamplingParams(max_tokens=6, temperature=0))
    assert output.metrics.total_draft_tokens > 0


def test_the_cpu_build_records_prompt_lookup(tiny_checkpoint, tmp_path):
    config = json.loads((_cpu_build(CPU_NGRAM, tiny_checkpoint, tmp_path) / "config.json").read_text())
    assert config["refengine_speculative"] == {"kind": "ngram", "max_draft_len": 4, "max_matching_ngram_size": 3}
    assert config["build_config"]["speculative_decoding_mode"] == 2 and not (tmp_path / "engine" / "draft").exists()


# -- the capacity planner counts both engines ---------------------------------------------------------------
def test_the_planner_counts_the_drafts_weights_and_kv_cache():
    from pipeline.capacity.planner import CapacityError, CapacityRequest, DraftModel, plan_capacity

    target = load_config(ENGINE_DRAFT).model
    draft_model = read_model_info(REPO / "models" / "llama-3.2-1b-instruct")
    common = dict(quant_algo="fp8", kv_cache_dtype="fp8", gpu="H200", max_seq_len=8192, max_batch_size=16, kv_cache_free_gpu_mem_fraction=0.45)
    alone = plan_capacity(CapacityRequest(target, **common))
    both = plan_capacity(CapacityRequest(target, **common, draft=DraftModel(draft_model, "fp8", "fp8", 8200)))
    d = both.draft
    # Llama-3.2-1B: 16 layers × 8 KV heads × head_dim 64 × 2 (K, V) × 1 byte (FP8)
    assert d.kv_bytes_per_token == 2 * 16 * 8 * 64
    assert 1.2e9 < d.weight_bytes_per_gpu < 2.5e9 and both.kv_space_bytes < alone.kv_space_bytes
    assert d.kv_space_bytes == pytest.approx(0.45 * (1 - 0.45) * (both.kv_space_bytes / 0.45))
    assert both.full_sequences <= min(alone.full_sequences, d.full_sequences)
    with pytest.raises(CapacityError, match="the draft's KV cache gets"):
        plan_capacity(CapacityRequest(target, **{**common, "kv_cache_free_gpu_mem_fraction": 1.0}, draft=DraftModel(draft_model, "fp8", "fp8", 8200)))
