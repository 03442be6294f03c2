"""Rendering the Triton model repository: every config parses with Triton's protobuf schema, the
two tensorrt_llm variants share one contract, every engine ↔ Triton check fails loudly with both
values named, and the default config's configs (and contract.json files) match the golden files.

Regenerate the golden files explicitly: `UPDATE_GOLDEN=1 pytest tests/pipeline/render/test_render.py`
(or `--update-golden` where the option is registered in conftest.py).
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from pipeline.backends.cpu.target import cpu_build_config
from pipeline.backends.engine_facts import engine_facts
from pipeline.backends.llm_parameters import engine_parameters, gpu_device_id_groups
from pipeline.config.spec import LookaheadSpec, LoraSpec, SchedulerPolicy, ServeLoraSpec, ServeSpec, Spec, SpeculativeSpec
from pipeline.errors import StageError
from pipeline.render import ConfigPaths, RepositoryRequest, check_consistency, contract, render_model_repository
from pipeline.render.contract_files import CONTRACT_FILE
from pipeline.render.pbtxt import lint_config, pbtxt_string

REPO = Path(__file__).resolve().parents[3]
TOKENIZER_DIR = REPO / "models" / "tiny-stdlib-llama"
MODEL_CODE = REPO / "model_repo" / "python"
GOLDEN = REPO / "tests" / "golden" / "model_repo_tiny_cpu"
GOLDEN_PATHS = ConfigPaths(engine_dir="/models/tiny-cpu/engine", tokenizer_dir="/models/tiny-cpu/tokenizer")
PYTHON_MODELS = ("preprocessing", "postprocessing", "tensorrt_llm_bls")
ALL_MODELS = ("ensemble", "postprocessing", "preprocessing", "tensorrt_llm", "tensorrt_llm_bls")


# -- fixtures ---------------------------------------------------------------------------------
def tiny_spec() -> Spec:
    return Spec.model_validate(yaml.safe_load((REPO / "build_configs" / "tiny-cpu.yaml").read_text()))


def tiny_lora_build():
    return tiny_spec().build.model_copy(update={"lora": LoraSpec(target_modules=("attn_q", "attn_v"), max_rank=16)})


def test_the_cpu_build_records_build_lora_as_trtllm_build_does():
    build_config = cpu_build_config(tiny_lora_build(), max_seq_len=1024, dtype="float16")
    assert build_config["plugin_config"]["lora_plugin"] == "float16"  # the LoRA plugin in the model's dtype
    assert build_config["lora_config"] == {"lora_dir": [], "lora_ckpt_source": "hf", "max_lora_rank": 16, "lora_target_modules": ["attn_q", "attn_v"]}
    assert "lora_plugin" not in cpu_build_config(tiny_spec().build, max_seq_len=1024, dtype="float16")["plugin_config"]


def tiny_engine_config(**build_overrides) -> dict:
    spec = tiny_spec()
    build_config = cpu_build_config(spec.build, max_seq_len=1024, dtype="float16")
    build_config.update(build_overrides)
    return {
        "version": "refengine-0.1.0",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "float16",
            "logits_dtype": "float16",
            "vocab_size": 4096,
            "hidden_size": 256,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
            "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
        },
        "build_config": build_config,
    }


def llama_8b_engine_config(tp_size: int = 1) -> dict:
    """What trtllm-build 1.2 writes for a Llama-3.1-8B FP8 engine (the fields the renderer reads)."""
    return {
        "version": "1.2.1",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "bfloat16",
            "logits_dtype": "float32",
            "vocab_size": 128256,
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "mapping": {"world_size": tp_size, "tp_size": tp_size, "pp_size": 1},
            "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
        },
        "build_config": {
            "max_batch_size": 256,
            "max_input_len": 8192,
            "max_seq_len": 16384,
            "max_num_tokens": 8192,
            "max_beam_width": 1,
            "kv_cache_type": "PAGED",
            "gather_context_logits": False,
            "gather_generation_logits": False,
            "plugin_config": {
                "gpt_attention_plugin": "auto",
                "context_fmha": True,
                "use_paged_context_fmha": True,
                "paged_kv_cache": True,
                "remove_input_padding": True,
                "tokens_per_block": 32,
            },
        },
    }


def lora_engine_config(max_lora_rank: int = 32) -> dict:
    """A Llama-3.1-8B engine built with --lora_plugin bfloat16 (as trtllm-build 1.2 records it)."""
    config = llama_8b_engine_config()
    config["build_config"]["plugin_config"]["lora_plugin"] = "bfloat16"
    config["build_config"]["lora_config"] = {
        "lora_dir": ["lora/0"],
        "lora_ckpt_source": "hf",
        "max_lora_rank": max_lora_rank,
        "lora_target_modules": ["attn_q", "attn_k", "attn_v", "attn_dense"],
    }
    return config


def lookahead_engine_config(max_draft_len: int = 15, max_beam_width: int = 1) -> dict:
    """A Llama-3.1-8B engine built with --speculative_decoding_mode lookahead_decoding (max_seq_len 16384 + draft)."""
    config = llama_8b_engine_config()
    config["build_config"].update(speculative_decoding_mode=8, max_draft_len=max_draft_len, max_seq_len=16384 + max_draft_len, max_beam_width=max_beam_width)
    return config


LOOKAHEAD = SpeculativeSpec(mode="lookahead_decoding")  # (W 4, N 3, G 4): 15 draft tokens


def write_engine_dir(directory: Path, config: dict, rank_suffix: str = ".safetensors") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    world_size = config["pretrained_config"]["mapping"]["world_size"]
    for rank in range(world_size):
        (directory / f"rank{rank}{rank_suffix}").write_bytes(b"")
    return directory


def render(tmp_path: Path, *, target: str = "cpu", config: dict | None = None, serve: ServeSpec | None = None, **kwargs) -> Path:
    if config is None:
        config = tiny_engine_config() if target == "cpu" else llama_8b_engine_config()
    engine_dir = write_engine_dir(tmp_path / "engine", config, ".safetensors" if target == "cpu" else ".engine")
    out_dir = tmp_path / "model_repository"
    render_model_repository(
        RepositoryRequest(
            engine_dir=engine_dir,
            tokenizer_dir=TOKENIZER_DIR,
            serve=serve or tiny_spec().serve,
            target=target,
            out_dir=out_dir,
            **kwargs,
        )
    )
    return out_dir


def parse(path: Path) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig()
    text_format.Parse(path.read_text(), config)
    return config


def tensors(entries) -> dict[str, tuple]:
    return {t.name: (t.data_type, tuple(t.dims), tuple(t.reshape.shape), t.HasField("reshape"), getattr(t, "optional", False)) for t in entries}


def parameters(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


@pytest.fixture(params=["cpu", "engine"])
def rendered(request, tmp_path) -> tuple[str, Path]:
    return request.param, render(tmp_path, target=request.param)


# -- every rendered file ----------------------------------------------------------------------
def test_every_config_parses_with_triton_schema_and_has_no_placeholder(rendered):
    target, repository = rendered
    assert sorted(p.name for p in repository.iterdir()) == list(ALL_MODELS)
    for model_dir in repository.iterdir():
        text = (model_dir / "config.pbtxt").read_text()
        for leftover in ("{{", "{%", "${", "None", 'string_value: ""'):
            assert leftover not in text, f"{model_dir.name}: {leftover!r} left in config.pbtxt"
        config = parse(model_dir / "config.pbtxt")
        assert config.name == model_dir.name
        assert (model_dir / "1").is_dir(), "Triton needs the version directory, even an empty one"
        for value in parameters(config).values():
            assert value.strip(), f"{model_dir.name}: empty parameter"


def test_python_models_get_their_code_and_helpers(rendered):
    target, repository = rendered
    python_models = PYTHON_MODELS + (("tensorrt_llm",) if target == "cpu" else ())
    for name in python_models:
        version_dir = repository / name / "1"
        assert (version_dir / "model.py").is_file()
        source = (version_dir / "model.py").read_text()
        for line in source.splitlines():
            if line.startswith("from ") and " import " in line:
                module = line.split()[1]
                if (MODEL_CODE / f"{module}.py").is_file():
                    assert (version_dir / f"{module}.py").is_file(), f"{name} imports {module} but it was not copied"
    assert list((repository / "ensemble" / "1").iterdir()) == []
    if target == "engine":
        assert list((repository / "tensorrt_llm" / "1").iterdir()) == []


def test_both_llm_variants_share_the_tensorrt_llm_contract(tmp_path):
    cpu = parse(render(tmp_path / "cpu", target="cpu") / "tensorrt_llm" / "config.pbtxt")
    engine = parse(render(tmp_path / "engine", target="engine") / "tensorrt_llm" / "config.pbtxt")
    assert cpu.backend == "python" and engine.backend == "tensorrtllm"
    assert cpu.model_transaction_policy.decoupled and engine.model_transaction_policy.decoupled
    # the engine's tensorrt_llm also takes the draft tokens of draft-target decoding (NVIDIA's config declares them);
    # the cpu engine drafts inside and takes a per-request draft length and acceptance (the BLS's inputs) instead,
    # and a scheduling priority
    draft_inputs = {"draft_input_ids", "draft_logits", "draft_acceptance_threshold"}
    cpu_inputs = tensors(cpu.input)
    assert cpu_inputs.pop("num_draft_tokens")[0] == model_config_pb2.TYPE_INT32  # the cpu model's three extra inputs
    assert cpu_inputs.pop("use_draft_logits")[0] == model_config_pb2.TYPE_BOOL
    assert cpu_inputs.pop("priority")[0] == model_config_pb2.TYPE_FP32
    assert cpu_inputs == {name: spec for name, spec in tensors(engine.input).items() if name not in draft_inputs}
    assert draft_inputs <= set(tensors(engine.input))
    cpu_outputs, engine_outputs = tensors(cpu.output), tensors(engine.output)
    assert set(cpu_outputs) - set(engine_outputs) == {"preceding_ids"}
    for name in ("output_ids", "sequence_length", "cum_log_probs", "output_log_probs", "sequence_index"):
        assert cpu_outputs[name] == engine_outputs[name]
    required = {name for name, spec in tensors(cpu.input).items() if not spec[4]}
    assert required == {"input_lengths", "request_output_len"}
    names = set(tensors(cpu.input))
    assert {
        "input_ids",
        "end_id",
        "pad_id",
        "streaming",
        "runtime_top_k",
        "runtime_top_p",
        "temperature",
        "seed",
        "repetition_penalty",
        "presence_penalty",
        "min_tokens",
        "stop_words_list",
        "bad_words_list",
        "beam_width",
        "num_return_sequences",
        "return_log_probs",
        "stop",
    } <= names
    dims = tensors(cpu.input)
    assert dims["stop_words_list"][:2] == (model_config_pb2.TYPE_INT32, (2, -1))
    assert dims["seed"][0] == model_config_pb2.TYPE_UINT64
    assert dims["input_lengths"][2:4] == ((), True)  # dims [1] reshaped to a scalar


def test_logits_outputs_take_the_engine_logits_dtype(tmp_path):
    cpu = parse(render(tmp_path / "cpu", target="cpu") / "ensemble" / "config.pbtxt")  # float16 logits
    engine = parse(render(tmp_path / "engine", target="engine") / "ensemble" / "config.pbtxt")  # float32 logits
    assert tensors(cpu.output)["context_logits"][0] == model_config_pb2.TYPE_FP16
    assert tensors(engine.output)["generation_logits"][0] == model_config_pb2.TYPE_FP32


def test_preprocessing_says_which_logits_the_engine_returns(tmp_path):
    def flags(directory, **options):
        parameters = parse(render(directory, **options) / "preprocessing" / "config.pbtxt").parameters
        return parameters["gather_context_logits"].string_value, parameters["gather_generation_logits"].string_value

    gathering = llama_8b_engine_config()
    gathering["build_config"]["gather_context_logits"] = True
    assert flags(tmp_path / "cpu", target="cpu") == ("true", "true")  # refengine computes both
    assert flags(tmp_path / "plain", target="engine") == ("false", "true")
    assert flags(tmp_path / "gather", target="engine", config=gathering) == ("true", "true")


def test_ensemble_wires_preprocessing_llm_postprocessing(tmp_path):
    for target in ("cpu", "engine"):
        config = parse(render(tmp_path / target, target=target) / "ensemble" / "config.pbtxt")
        assert config.platform == "ensemble"
        steps = {step.model_name: step for step in config.ensemble_scheduling.step}
        assert list(steps) == ["preprocessing", "tensorrt_llm", "postprocessing"]
        assert steps["preprocessing"].input_map["QUERY"] == "text_input"
        assert steps["tensorrt_llm"].input_map["input_ids"] == "_INPUT_ID"
        assert steps["tensorrt_llm"].input_map["runtime_top_k"] == "top_k"
        assert steps["tensorrt_llm"].input_map["streaming"] == "stream"
        assert steps["postprocessing"].output_map["OUTPUT"] == "text_output"
        has_context = "PRECEDING_IDS" in steps["postprocessing"].input_map
        assert has_context == (target == "cpu")
        client_inputs = {t.name for t in config.input}
        assert {
            "text_input",
            "max_tokens",
            "stream",
            "temperature",
            "top_k",
            "top_p",
            "seed",
            "repetition_penalty",
            "presence_penalty",
            "min_tokens",
            "bad_words",
            "stop_words",
            "end_id",
            "pad_id",
            "exclude_input_in_output",
        } <= client_inputs
        mapped = set(steps["preprocessing"].input_map.values()) | set(steps["tensorrt_llm"].input_map.values())
        assert client_inputs <= mapped, "every client input reaches a model"


def test_engine_variant_fills_every_backend_parameter(tmp_path):
    serve = tiny_spec().serve.model_copy(update={"kv_cache_free_gpu_mem_fraction": 0.85})
    repository = render(tmp_path, target="engine", serve=serve, config_paths=ConfigPaths("/engines/llama", "/tok"))
    values = parameters(parse(repository / "tensorrt_llm" / "config.pbtxt"))
    assert set(values) == {
        "gpt_model_type",
        "gpt_model_path",
        "max_beam_width",
        "FORCE_CPU_ONLY_INPUT_TENSORS",
        "batch_scheduler_policy",
        "kv_cache_free_gpu_mem_fraction",
        "kv_cache_host_memory_bytes",
        "kv_cache_onboard_blocks",
        "max_attention_window_size",
        "sink_token_length",
        "enable_kv_cache_reuse",
        "enable_chunked_context",
        "exclude_input_in_output",
        "normalize_log_probs",
        "cancellation_check_period_ms",
        "stats_check_period_ms",
        "iter_stats_max_iterations",
        "request_stats_max_iterations",
        "decoding_mode",
        "speculative_decoding_fast_logits",
        "gpu_weights_percent",
        "enable_context_fmha_fp32_acc",
        "multi_block_mode",
        "cuda_graph_mode",
        "cuda_graph_cache_size",
        "num_nodes",
        "lora_cache_optimal_adapter_size",
        "lora_cache_max_adapter_size",
        "lora_cache_gpu_memory_fraction",
        "lora_cache_host_memory_bytes",
        "executor_worker_path",
        "guided_decoding_backend",
        "xgrammar_tokenizer_info_path",
        "tokenizer_dir",
    }
    assert values["guided_decoding_backend"] == "xgrammar" and values["tokenizer_dir"] == "/tok"
    assert values["xgrammar_tokenizer_info_path"] == str((repository / "tensorrt_llm" / "xgrammar_tokenizer_info.json").resolve())
    assert values["gpt_model_type"] == "inflight_fused_batching"
    assert values["gpt_model_path"] == "/engines/llama"
    assert values["kv_cache_free_gpu_mem_fraction"] == "0.85"
    assert values["max_attention_window_size"] == "16384"
    assert values["max_beam_width"] == "1" and values["decoding_mode"] == "top_k_top_p"
    assert values["enable_kv_cache_reuse"] == "true" and values["batch_scheduler_policy"] == "guaranteed_no_evict"
    preprocessing = parameters(parse(repository / "preprocessing" / "config.pbtxt"))
    assert preprocessing["tokenizer_dir"] == "/tok" and preprocessing["max_input_len"] == "8192"


def test_gpu_device_ids_are_grouped_per_instance(tmp_path):
    serve = tiny_spec().serve.model_copy(update={"instances": tiny_spec().serve.instances.model_copy(update={"tensorrt_llm": 2})})
    repository = render(tmp_path, target="engine", config=llama_8b_engine_config(tp_size=2), serve=serve, gpu_device_ids=(0, 1, 2, 3))
    config = parse(repository / "tensorrt_llm" / "config.pbtxt")
    assert parameters(config)["gpu_device_ids"] == "0,1;2,3"
    assert config.instance_group[0].count == 2
    assert gpu_device_id_groups([4, 5, 6], 1) == "4;5;6"


def test_rendering_is_deterministic(tmp_path):
    first = render(tmp_path / "a", config_paths=GOLDEN_PATHS)
    second = render(tmp_path / "b", config_paths=GOLDEN_PATHS)
    for path in sorted(first.rglob("*")):
        if path.is_file():
            assert path.read_bytes() == (second / path.relative_to(first)).read_bytes(), path


def test_refuses_a_non_empty_output_directory(tmp_path):
    (tmp_path / "model_repository").mkdir()
    (tmp_path / "model_repository" / "stale").mkdir()
    with pytest.raises(StageError, match="not empty"):
        render(tmp_path)


# -- golden files -------------------------------------------------------------------------------
def _update_golden(request) -> bool:
    try:
        flag = bool(request.config.getoption("--update-golden"))
    except ValueError:  # the option is not registered
        flag = False
    return flag or os.environ.get("UPDATE_GOLDEN") == "1"


def _golden_files(root: Path) -> dict[str, str]:
    """Each model's config.pbtxt and contract.json, by path relative to the repository."""
    paths = [*root.glob("*/config.pbtxt"), *root.glob(f"*/1/{CONTRACT_FILE}")]
    return {path.relative_to(root).as_posix(): path.read_text() for path in sorted(paths)}


def test_default_config_matches_golden_files(tmp_path, request):
    repository = render(tmp_path, config_paths=GOLDEN_PATHS)
    rendered = _golden_files(repository)
    if _update_golden(request):
        for name, text in rendered.items():
            (GOLDEN / name).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / name).write_text(text)
        pytest.skip(f"golden files rewritten in {GOLDEN}")
    golden = _golden_files(GOLDEN)
    assert sorted(golden) == sorted(rendered), f"golden files differ; regenerate with UPDATE_GOLDEN=1 ({GOLDEN})"
    for name, text in rendered.items():
        if text != golden[name]:
            diff = "".join(difflib.unified_diff(golden[name].splitlines(True), text.splitlines(True), f"golden/{name}", f"rendered/{name}"))
            pytest.fail(f"{name} differs from the golden file; if intended, regenerate with UPDATE_GOLDEN=1\n{diff}")


# -- engine ↔ Triton consistency ----------------------------------------------------------------
def _check(config=None, *, serve=None, target="cpu", vocab=4096, **kwargs):
    check_consistency(config or tiny_engine_config(), serve or tiny_spec().serve, target, vocab, **kwargs)


def _with(config: dict, section: str, **values) -> dict:
    copied = json.loads(json.dumps(config))
    target = copied[section] if section != "plugin_config" else copied["build_config"]["plugin_config"]
    target.update(values)
    return copied


def _serve(**values) -> ServeSpec:
    return tiny_spec().serve.model_copy(update=values)


CONSISTENCY_CASES = {
    "triton batch above engine": (dict(triton_max_batch_size=64), ["Triton max_batch_size 64", "max_batch_size 32"]),
    "streaming needs decoupled": (dict(serve=_serve(decoupled=False)), ["serve.streaming is true", "serve.decoupled is false"]),
    "kv reuse needs paged context fmha": (
        dict(config=_with(tiny_engine_config(), "plugin_config", use_paged_context_fmha=False), serve=_serve(enable_chunked_context=False)),
        ["serve.enable_kv_cache_reuse is true", "use_paged_context_fmha False"],
    ),
    "chunked context needs paged context fmha": (
        dict(config=_with(tiny_engine_config(), "plugin_config", use_paged_context_fmha=False), serve=_serve(enable_kv_cache_reuse=False)),
        ["serve.enable_chunked_context is true", "use_paged_context_fmha False"],
    ),
    "int8 kv cache turns paged context off": (
        dict(config=_with(tiny_engine_config(), "pretrained_config", quantization={"quant_algo": None, "kv_cache_quant_algo": "INT8"})),
        ["serve.enable_kv_cache_reuse is true", "kv_cache_quant_algo INT8"],
    ),
    "unknown logits dtype": (
        dict(config=_with(tiny_engine_config(), "pretrained_config", logits_dtype="float8")),
        ["logits_dtype 'float8'", "no Triton data type"],
    ),
    "logits dtype mismatch": (dict(logits_datatype="TYPE_FP32"), ["TYPE_FP32", "logits_dtype 'float16'", "TYPE_FP16"]),
    "tokenizer larger than engine vocab": (dict(vocab=5000), ["5000 token ids", "vocab_size is 4096"]),
    "eos outside the engine vocab": (dict(tokenizer_eos_id=4096), ["eos token id 4096", "vocab_size 4096"]),
    "beam width above engine": (dict(max_beam_width=8), ["Triton max_beam_width 8", "max_beam_width 4"]),
    "gpu count must cover tp x pp x instances": (
        dict(config=llama_8b_engine_config(tp_size=2), target="engine", vocab=128256, gpu_device_ids=(0, 1, 2)),
        ["deploy.gpus lists 3 GPU(s)", "tp_size 2", "= 2 are needed"],
    ),
    "several instances need gpu ids": (
        dict(
            config=llama_8b_engine_config(),
            target="engine",
            vocab=128256,
            serve=_serve(instances=tiny_spec().serve.instances.model_copy(update={"tensorrt_llm": 2})),
        ),
        ["serve.instances.tensorrt_llm is 2", "deploy.gpus is empty"],
    ),
    "world size differs from tp x pp": (
        dict(config=_with(tiny_engine_config(), "pretrained_config", mapping={"world_size": 2, "tp_size": 1, "pp_size": 1})),
        ["world_size 2", "tp_size 1 × pp_size 1 = 1"],
    ),
    "cpu target runs one rank": (
        dict(config=_with(tiny_engine_config(), "pretrained_config", mapping={"world_size": 2, "tp_size": 2, "pp_size": 1})),
        ["build.target is cpu", "tp_size 2 × pp_size 1 = 2 ranks"],
    ),
    "rank files must match world size": (
        dict(config=llama_8b_engine_config(tp_size=2), target="engine", vocab=128256, rank_files=["rank0.engine"]),
        ["world_size 2", "lacks rank1.engine"],
    ),
    "inflight batching needs paged kv": (dict(config=tiny_engine_config(kv_cache_type="CONTINUOUS")), ["paged KV cache", "'CONTINUOUS'"]),
    "prompt above max_num_tokens without chunking": (
        dict(config=tiny_engine_config(max_num_tokens=512), serve=_serve(enable_chunked_context=False)),
        ["max_num_tokens 512", "max_input_len 768"],
    ),
    "cpu target needs a cpu-built engine": (dict(config={**tiny_engine_config(), "version": "1.2.1"}), ["build.target is cpu", "'1.2.1'"]),
    "engine target needs a TensorRT-LLM engine": (dict(target="engine"), ["build.target is engine", "'refengine-0.1.0'"]),
    "ensemble name collides": (dict(serve=_serve(model_name="preprocessing")), ["serve.model_name 'preprocessing'"]),
    # LoRA: the engine's LoRA plugin, dtype and ranks
    "lora cache without a lora engine": (
        dict(config=llama_8b_engine_config(), target="engine", vocab=128256, serve=_serve(lora=ServeLoraSpec())),
        ["serve.lora sets the LoRA cache", "plugin_config.lora_plugin null"],
    ),
    "lora cache below the engine's rank": (
        dict(config=lora_engine_config(32), target="engine", vocab=128256, serve=_serve(lora=ServeLoraSpec(cache_max_adapter_size=16))),
        ["serve.lora.cache_max_adapter_size (lora_cache_max_adapter_size 16)", "build_config.lora_config.max_lora_rank 32"],
    ),
    "cpu lora cache below the engine's rank": (
        dict(
            config={**tiny_engine_config(), "build_config": cpu_build_config(tiny_lora_build(), max_seq_len=1024, dtype="float16")},
            serve=_serve(lora=ServeLoraSpec(cache_optimal_adapter_size=4, cache_max_adapter_size=8)),
        ),
        ["serve.lora.cache_max_adapter_size (lora_cache_max_adapter_size 8)", "build_config.lora_config.max_lora_rank 16"],
    ),
    "lora weights in another dtype": (
        dict(config=lora_engine_config(), target="engine", vocab=128256, lora_weights_datatype="TYPE_FP16"),
        ["Triton lora_weights data type TYPE_FP16", "plugin_config.lora_plugin 'bfloat16' (TYPE_BF16)"],
    ),
    # speculative decoding: decoding_mode and the engine's mode
    "lookahead engine without build.speculative": (
        dict(config=lookahead_engine_config(), target="engine", vocab=128256),
        ["build_config.speculative_decoding_mode lookahead_decoding (max_draft_len 15)", "build.speculative.mode is absent"],
    ),
    "build.speculative without a lookahead engine": (
        dict(config=llama_8b_engine_config(), target="engine", vocab=128256, speculative=LOOKAHEAD),
        ["build_config.speculative_decoding_mode none", "build.speculative.mode is lookahead_decoding"],
    ),
    "lookahead window needs another draft length": (
        dict(
            config=lookahead_engine_config(15),
            target="engine",
            vocab=128256,
            speculative=SpeculativeSpec(mode="lookahead_decoding", lookahead=LookaheadSpec(window_size=5)),
        ),
        ["(W 5, N 3, G 4) needs max_draft_len 17", "build_config.max_draft_len 15"],
    ),
    "medusa engine": (
        dict(config=_with(llama_8b_engine_config(), "build_config", speculative_decoding_mode=4, max_draft_len=63), target="engine", vocab=128256),
        ["build_config.speculative_decoding_mode medusa", "build.speculative.mode is absent"],
    ),
    "lookahead engine with beams": (
        dict(config=lookahead_engine_config(max_beam_width=2), target="engine", vocab=128256, speculative=LOOKAHEAD),
        ["speculative_decoding_mode lookahead_decoding and build_config.max_beam_width 2", "excludes beam_search"],
    ),
}


@pytest.mark.parametrize("case", sorted(CONSISTENCY_CASES))
def test_each_consistency_check_names_both_sides(case):
    kwargs, expected = CONSISTENCY_CASES[case]
    with pytest.raises(StageError) as raised:
        _check(**kwargs)
    for fragment in expected:
        assert fragment in raised.value.message, f"{case}: {fragment!r} not in:\n{raised.value.message}"


def test_consistent_engines_pass():
    _check()
    _check(tiny_engine_config(max_beam_width=4), max_beam_width=4)  # the cpu engine does beam search (#15)
    _check(llama_8b_engine_config(), target="engine", vocab=128256, gpu_device_ids=(0,), rank_files=["rank0.engine"])


def test_all_problems_are_reported_together():
    config = _with(tiny_engine_config(), "plugin_config", use_paged_context_fmha=False)
    with pytest.raises(StageError) as raised:
        _check(config, vocab=5000, triton_max_batch_size=99)
    assert "4 problem(s)" in raised.value.message  # batch, reuse, chunking, vocabulary


def test_unknown_target_and_missing_engine_keys_are_refused(tmp_path):
    with pytest.raises(StageError, match="'llmapi' has no Triton model repository"):
        _check(target="llmapi")
    broken = tiny_engine_config()
    del broken["build_config"]["max_seq_len"]
    with pytest.raises(StageError, match="build_config.max_seq_len is missing"):
        engine_facts(broken)
    with pytest.raises(StageError, match="does not exist"):
        render_model_repository(
            RepositoryRequest(engine_dir=tmp_path / "nothing", tokenizer_dir=TOKENIZER_DIR, serve=ServeSpec(), target="cpu", out_dir=tmp_path / "r")
        )


# -- pbtxt helpers --------------------------------------------------------------------------------
def test_pbtxt_strings_are_escaped_and_leftovers_refused():
    assert pbtxt_string('a "b" \\c') == '"a \\"b\\" \\\\c"'
    with pytest.raises(StageError, match="None"):
        pbtxt_string(None)
    for text, what in (
        ('x: "${engine_dir}"', "placeholder"),
        ("x: {{ y }}", "Jinja"),
        ("max_batch_size: None", "None"),
        ('value: { string_value: "" }', "empty string"),
    ):
        with pytest.raises(StageError, match=what):
            lint_config(text, "model/config.pbtxt")


def test_engine_parameters_follow_the_engine_and_spec():
    facts = engine_facts(llama_8b_engine_config(tp_size=2))
    values = engine_parameters(
        facts, _serve(enable_kv_cache_reuse=False, batch_scheduler_policy=SchedulerPolicy.max_utilization), engine_dir="/e", gpu_device_ids=(0, 1)
    )
    assert values["enable_kv_cache_reuse"] == "false"
    assert values["batch_scheduler_policy"] == "max_utilization"
    assert values["gpu_device_ids"] == "0,1"


# -- LoRA and speculative decoding (engine target) ------------------------------------------------------------
def test_lora_engine_gets_lora_inputs_in_its_plugin_dtype(tmp_path):
    serve = _serve(lora=ServeLoraSpec(cache_optimal_adapter_size=16, cache_gpu_memory_fraction=0.1))
    repository = render(tmp_path, target="engine", config=lora_engine_config(32), serve=serve)
    llm = parse(repository / "tensorrt_llm" / "config.pbtxt")
    inputs = tensors(llm.input)
    assert inputs["lora_weights"][:2] == (model_config_pb2.TYPE_BF16, (-1, -1)) and inputs["lora_weights"][4]
    assert inputs["lora_config"][:2] == (model_config_pb2.TYPE_INT32, (-1, 3))
    assert inputs["lora_task_id"][:4] == (model_config_pb2.TYPE_UINT64, (1,), (), True)
    values = parameters(llm)
    assert (values["lora_cache_optimal_adapter_size"], values["lora_cache_max_adapter_size"]) == ("16", "32")  # max: the engine's rank
    assert values["lora_cache_gpu_memory_fraction"] == "0.1" and values["lora_cache_host_memory_bytes"] == str(1 << 30)
    ensemble = parse(repository / "ensemble" / "config.pbtxt")
    assert tensors(ensemble.input)["lora_weights"][0] == model_config_pb2.TYPE_BF16
    step = {s.model_name: s for s in ensemble.ensemble_scheduling.step}["tensorrt_llm"]
    assert {k: step.input_map[k] for k in ("lora_task_id", "lora_weights", "lora_config")} == contract.LORA_CLIENT_TO_LLM
    bls = parse(repository / "tensorrt_llm_bls" / "config.pbtxt")
    assert {"lora_task_id", "lora_weights", "lora_config"} <= set(tensors(bls.input))


def test_a_cpu_engine_built_with_lora_gets_the_lora_inputs_its_cache_sizes_and_prefetch_dir(tmp_path):
    config = {**tiny_engine_config(), "build_config": cpu_build_config(tiny_lora_build(), max_seq_len=1024, dtype="float16")}
    serve = _serve(lora=ServeLoraSpec(cache_max_adapter_size=32, cache_host_memory_bytes=1 << 20, prefetch_dir="/srv/adapters"))
    llm = parse(render(tmp_path, target="cpu", config=config, serve=serve) / "tensorrt_llm" / "config.pbtxt")
    assert tensors(llm.input)["lora_weights"][0] == model_config_pb2.TYPE_FP16  # the build's lora_plugin float16
    values = parameters(llm)
    assert (values["lora_cache_max_adapter_size"], values["lora_cache_host_memory_bytes"]) == ("32", str(1 << 20))
    assert values["lora_prefetch_dir"] == "/srv/adapters"
    assert "lora_cache_max_adapter_size" not in parameters(parse(render(tmp_path / "plain", target="cpu") / "tensorrt_llm" / "config.pbtxt"))


def test_lora_cache_defaults_follow_the_engine(tmp_path):
    values = parameters(parse(render(tmp_path, target="engine", config=lora_engine_config(4)) / "tensorrt_llm" / "config.pbtxt"))
    assert (values["lora_cache_optimal_adapter_size"], values["lora_cache_max_adapter_size"]) == ("4", "4")


@pytest.mark.parametrize("target", ["engine", "cpu"])
def test_repositories_without_a_lora_plugin_declare_the_lora_inputs_as_nvidia_does(tmp_path, target):
    """NVIDIA's templates always declare them (FP16): a LoRA request is then answered by the model
    (the backend's error, or the cpu model's refusal by name), never with "unexpected input"."""
    repository = render(tmp_path, target=target)
    fp16 = model_config_pb2.DataType.Value("TYPE_FP16")
    for model in ("tensorrt_llm", "ensemble", "tensorrt_llm_bls"):
        declared = tensors(parse(repository / model / "config.pbtxt").input)
        assert {name for name in declared if name.startswith("lora")} == {"lora_task_id", "lora_weights", "lora_config"}
        assert declared["lora_weights"][0] == fp16


def test_lookahead_engine_gets_its_decoding_mode_and_window(tmp_path):
    repository = render(tmp_path, target="engine", config=lookahead_engine_config(15), speculative=LOOKAHEAD)
    values = parameters(parse(repository / "tensorrt_llm" / "config.pbtxt"))
    assert values["decoding_mode"] == "lookahead"
    assert (values["lookahead_window_size"], values["lookahead_ngram_size"], values["lookahead_verification_set_size"]) == ("4", "3", "4")
    assert values["max_attention_window_size"] == str(16384 + 15)  # the engine's max_seq_len, draft tokens included
    # requests may use the max_seq_len of the build config: trtllm-build added the draft tokens on top (builder.py)
    assert parameters(parse(repository / "preprocessing" / "config.pbtxt"))["max_seq_len"] == "16384"


def test_default_engine_decodes_top_k_top_p_without_lookahead_parameters(tmp_path):
    values = parameters(parse(render(tmp_path, target="engine") / "tensorrt_llm" / "config.pbtxt"))
    assert values["decoding_mode"] == "top_k_top_p" and not [k for k in values if k.startswith("lookahead")]


# -- the package stage ----------------------------------------------------------------------------
def test_package_stage_writes_the_repository(tmp_path):
    from types import SimpleNamespace

    from pipeline.artifacts import ArtifactRef
    from pipeline.stages import package

    build_dir = tmp_path / "build-x"
    write_engine_dir(build_dir / "engine", tiny_engine_config())
    logged = []
    ctx = SimpleNamespace(
        spec=tiny_spec(),
        upstream={"build": ArtifactRef("build", "x", build_dir, {}), "prepare": ArtifactRef("prepare", "y", TOKENIZER_DIR, {})},
        out_dir=tmp_path / "package-x",
        final_dir=None,
        log=logged.append,
    )
    ctx.out_dir.mkdir()
    package.run(ctx)
    repository = ctx.out_dir / package.REPOSITORY_DIR
    assert sorted(p.name for p in repository.iterdir()) == list(ALL_MODELS)
    assert parameters(parse(repository / "tensorrt_llm" / "config.pbtxt"))["engine_dir"] == str((build_dir / "engine").resolve())
    assert "5 models" in logged[-1]
    assert "serve.instances.postprocessing: 1 (1: build.target cpu" in logged[1]  # the planner's reasoning, logged


# -- model code that ships in the repository (pure parts, importable outside Triton) -------------
@pytest.fixture
def model_code(monkeypatch):
    monkeypatch.syspath_prepend(str(MODEL_CODE))
    yield
    for name in ("incremental_detokenizer", "word_lists", "llm_request", "llm_response", "client_contract", "model_contract", "hf_tokenizer"):
        sys.modules.pop(name, None)


@pytest.fixture
def tokenizer(model_code):
    from hf_tokenizer import HFTokenizer

    return HFTokenizer(TOKENIZER_DIR)


def test_streamed_deltas_keep_multibyte_characters_and_spaces(tokenizer):
    from incremental_detokenizer import REPLACEMENT_CHARACTER, IncrementalDetokenizer

    prompt = tokenizer.encode("# greeting")
    text = " héllo 你好 🎉 wörld"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert any(REPLACEMENT_CHARACTER in tokenizer.decode([i]) for i in ids), "the sample must split characters across tokens"
    detokenizer = IncrementalDetokenizer(tokenizer.decode, prompt)
    deltas = [detokenizer.push([token_id]) for token_id in ids]
    assert "".join(deltas) == text
    assert deltas[0] == " " or deltas[0].startswith(" "), "the leading space of the first token is kept"
    for delta in deltas:
        assert REPLACEMENT_CHARACTER not in delta
    # whole characters only: every delta is valid on its own
    assert all(delta.encode("utf-8").decode("utf-8") == delta for delta in deltas)
    assert detokenizer.output_ids == ids


def test_text_delta_in_uneven_chunks_equals_the_whole_decode(tokenizer):
    from incremental_detokenizer import CONTEXT_TOKENS, text_delta

    ids = tokenizer.encode("x = '日本語テキスト' + \"ü\" * 3", add_special_tokens=False)
    for chunk in (1, 2, 3, 5):
        emitted, history = "", []
        for start in range(0, len(ids), chunk):
            new = ids[start : start + chunk]
            emitted += text_delta(tokenizer.decode, history[-CONTEXT_TOKENS:], new)
            history += new
        assert emitted == tokenizer.decode(ids), chunk


def test_a_cut_off_character_at_the_end_is_held_back(tokenizer):
    from incremental_detokenizer import text_delta

    ids = tokenizer.encode("ok 你", add_special_tokens=False)
    partial = ids[:-1]  # the last byte of 你 is missing
    assert text_delta(tokenizer.decode, [], partial) == "ok "


def test_word_lists_round_trip_and_reject_malformed_offsets(model_code):
    from word_lists import WordListError, from_word_list, to_word_list, to_word_list_batch

    words = [[5, 6], [7]]
    array = to_word_list(words)
    assert array.tolist() == [[5, 6, 7], [2, 3, -1]]
    assert from_word_list(array) == ((5, 6), (7,))
    assert to_word_list([]).tolist() == [[0], [-1]]
    batch = to_word_list_batch([[[1]], [[2, 3], [4, 5, 6]]])
    assert batch.shape == (2, 2, 5)
    assert from_word_list(batch[0]) == ((1,),) and from_word_list(batch[1]) == ((2, 3), (4, 5, 6))
    with pytest.raises(WordListError, match="stop_words_list: offset 9"):
        from_word_list(np.array([[1, 2], [9, -1]], dtype=np.int32), "stop_words_list")
    with pytest.raises(WordListError, match=r"shape \[2, L\]"):
        from_word_list(np.zeros((3, 2), dtype=np.int32))


def _arrays(**values):
    arrays = {
        "input_ids": np.array([[1, 317, 289, 0]], dtype=np.int32),
        "input_lengths": np.array([3], dtype=np.int32),
        "request_output_len": np.array([8], dtype=np.int32),
    }
    for name, value in values.items():
        arrays[name] = np.array([value])
    return arrays


def test_llm_request_follows_tensorrt_llm_semantics(model_code):
    from llm_request import GenerateRequest, StopRequest, parse_request

    parsed = parse_request(_arrays(end_id=2), exclude_input_default=True, decoupled=True)
    assert isinstance(parsed, GenerateRequest)
    assert parsed.prompt_ids == (1, 317, 289)  # input_lengths trims the padding
    assert parsed.params.is_greedy and parsed.params.max_tokens == 8 and parsed.params.end_id == 2
    top_k = parse_request(_arrays(runtime_top_k=5, temperature=0.7), exclude_input_default=True, decoupled=True)
    assert top_k.params.top_k == 5 and top_k.params.top_p == 1.0 and top_k.params.temperature == pytest.approx(0.7)
    stop_words = np.array([[[5, 6, 7], [2, 3, -1]]], dtype=np.int32)
    words = parse_request({**_arrays(), "stop_words_list": stop_words}, exclude_input_default=True, decoupled=True)
    assert words.params.stop_token_ids == ((5, 6), (7,))
    assert isinstance(parse_request(_arrays(stop=True), exclude_input_default=True, decoupled=True), StopRequest)
    # NVIDIA's ensemble always sends the decoder placeholder and beam-search knobs; at beam 1 they change nothing
    nvidia = parse_request(
        _arrays(decoder_input_lengths=1, len_penalty=1.0, early_stopping=True, guided_decoding_guide_type=b""),
        exclude_input_default=True,
        decoupled=True,
    )
    assert nvidia.params == parsed.params.__class__(max_tokens=8, temperature=0.0)


def test_embedding_bias_becomes_the_engines_logit_bias(model_code):
    from llm_request import ContractError, parse_request

    bias = np.zeros((1, 16), dtype=np.float32)
    bias[0, 5], bias[0, 9] = -100.0, 2.5
    parsed = parse_request({**_arrays(), "embedding_bias": bias}, exclude_input_default=True, decoupled=True)
    assert parsed.params.logit_bias == ((5, -100.0), (9, 2.5))
    empty = parse_request({**_arrays(), "embedding_bias": np.zeros((1, 0), dtype=np.float32)}, exclude_input_default=True, decoupled=True)
    assert empty.params.logit_bias == ()
    with pytest.raises(ContractError, match="embedding_bias: must hold finite numbers"):
        parse_request({**_arrays(), "embedding_bias": np.full((1, 4), np.inf, dtype=np.float32)}, exclude_input_default=True, decoupled=True)


def test_a_batched_request_becomes_one_request_per_row(model_code):
    from llm_request import ContractError, parse_batch

    arrays = {
        "input_ids": np.array([[1, 317, 289, 0], [1, 40, 0, 0]], dtype=np.int32),
        "input_lengths": np.array([[3], [2]], dtype=np.int32),
        "request_output_len": np.array([[8], [4]], dtype=np.int32),
        "temperature": np.array([[0.5]], dtype=np.float32),  # one row: applies to both
    }
    first, second = parse_batch(arrays, exclude_input_default=True, decoupled=True)
    assert (first.prompt_ids, first.params.max_tokens, first.batch_index) == ((1, 317, 289), 8, 0)
    assert (second.prompt_ids, second.params.max_tokens, second.batch_index) == ((1, 40), 4, 1)
    with pytest.raises(ContractError, match=r"batch row 1: input_lengths: 9 must be between 1 and the 4 tokens"):
        parse_batch({**arrays, "input_lengths": np.array([[3], [9]], dtype=np.int32)}, exclude_input_default=True, decoupled=True)
    with pytest.raises(ContractError, match=r"end_id: expected a leading batch axis of 1 or 2 \(input_ids\), got shape \[3, 1\]"):
        parse_batch({**arrays, "end_id": np.zeros((3, 1), dtype=np.int32)}, exclude_input_default=True, decoupled=True)


def test_llm_response_adds_token_counts_and_perf_metrics_on_request(model_code):
    from llm_request import parse_request
    from llm_response import final_arrays, streamed_arrays

    from refengine import CompletionOutput, RequestMetrics

    request = parse_request(
        _arrays(return_perf_metrics=True, return_num_input_tokens=True, return_num_output_tokens=True),
        exclude_input_default=True,
        decoupled=True,
    )
    metrics = RequestMetrics(100, 150, 200, 260, kv_new_blocks=2, kv_reused_blocks=1)
    completion = CompletionOutput(index=0, token_ids=(5, 6, 7), new_token_ids=(7,))
    streamed = streamed_arrays(request, completion, metrics)
    assert {name: streamed[name].tolist() for name in ("num_input_tokens", "num_output_tokens", "batch_index")} == {
        "num_input_tokens": [[3]],
        "num_output_tokens": [[3]],
        "batch_index": [[0]],
    }
    assert streamed["kv_cache_alloc_total_blocks"].tolist() == [[3]] and streamed["kv_cache_reused_blocks"].tolist() == [[1]]
    assert streamed["last_token_time_ns"].dtype == np.int64 and streamed["last_token_time_ns"].tolist() == [[260]]
    assert streamed["total_draft_tokens"].tolist() == [[0]] and streamed["acceptance_rate"].dtype == np.float32
    plain = final_arrays(parse_request(_arrays(), exclude_input_default=True, decoupled=True), completion, metrics)
    assert not {"num_input_tokens", "num_output_tokens", "arrival_time_ns"} & set(plain)


def test_logit_outputs_have_tensorrt_llm_shapes(model_code):
    import torch
    from llm_request import parse_request
    from llm_response import final_arrays, streamed_arrays

    from refengine import CompletionOutput

    arrays = _arrays()
    arrays["return_context_logits"] = np.array([True])
    arrays["return_generation_logits"] = np.array([True])
    request = parse_request(arrays, exclude_input_default=True, decoupled=True)
    assert request.params.return_context_logits and request.params.return_generation_logits
    context = torch.arange(4 * 6, dtype=torch.float32).reshape(4, 6)  # [prompt 4, vocab 6]
    rows = torch.ones((1, 6))
    completion = CompletionOutput(index=0, token_ids=(5, 6), new_token_ids=(6,), new_generation_logits=rows)
    streamed = streamed_arrays(request, completion, None, context)
    assert streamed["context_logits"].shape == (1, 4, 6) and streamed["context_logits"].dtype == np.float32
    assert streamed["generation_logits"].shape == (1, 1, 1, 6)
    assert "context_logits" not in streamed_arrays(request, completion)  # only where the model passes them
    final = final_arrays(request, completion, None, context, [torch.zeros((1, 6)), rows])
    assert final["generation_logits"].shape == (1, 1, 2, 6) and final["generation_logits"][0, 0, 1].tolist() == [1.0] * 6
    plain = final_arrays(parse_request(_arrays(), exclude_input_default=True, decoupled=True), completion, None, context)
    assert not {"context_logits", "generation_logits"} & set(plain)


@pytest.mark.parametrize(
    "values, decoupled, message",
    [
        (dict(request_output_len=0), True, "request_output_len: must be >= 1, got 0"),
        (dict(runtime_top_p=1.5), True, "runtime_top_p: must be in (0, 1], got 1.5"),
        (dict(beam_width=2, num_return_sequences=3), True, "num_return_sequences: 3 sequences exceed beam_width 2"),
        (dict(beam_width=2, runtime_top_k=5), True, "runtime_top_k: 5 with beam_width 2: beam search does not sample"),
        (dict(beam_width=0), True, "beam_width: must be >= 1, got 0"),
        (dict(streaming=True), False, "streaming: streaming is only supported if the model is deployed in decoupled mode"),
        (dict(input_lengths=9), True, "input_lengths: 9 must be between 1 and the 4 tokens of input_ids"),
        (dict(min_tokens=20), True, "min_tokens: 20 exceeds max_tokens 8"),
        (dict(guided_decoding_guide=b"[0-9]+"), True, "guided_decoding_guide_type: a guided_decoding_guide was given without a guide type"),
        (dict(guided_decoding_guide_type=b"regex"), True, "guided_decoding_guide: guide type 'regex' needs a guide"),
        (dict(lookahead_window_size=4), True, "lookahead_window_size: lookahead decoding is not done"),
        (dict(len_penalty=float("nan")), True, "len_penalty: must be a finite number"),
        (dict(return_num_output_tokens=True, num_return_sequences=2), True, "return_num_output_tokens: not available with num_return_sequences 2"),
    ],
)
def test_llm_request_errors_name_the_contract_input(model_code, values, decoupled, message):
    from llm_request import ContractError, parse_request

    arrays = _arrays()
    for name, value in values.items():
        arrays[name] = np.array([value])
    with pytest.raises(ContractError) as raised:
        parse_request(arrays, exclude_input_default=True, decoupled=decoupled)
    assert message in str(raised.value)


def test_lora_inputs_become_the_requests_lora_request(model_code):
    from llm_request import parse_request

    arrays = _arrays()
    assert parse_request(arrays, exclude_input_default=True, decoupled=True).lora is None
    weights, config = np.zeros((1, 2, 8), np.float16), np.array([[[1, 0, 2], [2, 0, 2]]], np.int32)
    arrays.update(lora_task_id=np.array([[7]], np.uint64), lora_weights=weights, lora_config=config)
    lora = parse_request(arrays, exclude_input_default=True, decoupled=True).lora
    assert lora.task_id == 7 and lora.weights is weights and lora.config is config  # checked by the engine's LoRA cache


def test_the_bls_names_a_figure_its_llm_model_did_not_return(model_code):
    from client_contract import figures_not_given

    asked = {"return_perf_metrics": np.array([[True]]), "return_num_output_tokens": np.array([[False]])}
    requested = {"kv_cache_alloc_new_blocks", "num_output_tokens", "text_output"}
    assert figures_not_given(asked, {"output_ids": 1}, requested) == "return_perf_metrics"
    assert figures_not_given(asked, {"output_ids": 1, "kv_cache_alloc_new_blocks": 1}, requested) is None
    assert figures_not_given(asked, {"output_ids": 1}, {"text_output"}) is None  # not asked for as an output


def test_beam_search_returns_every_beam_in_one_response(model_code):
    """TensorRT-LLM's shapes: output_ids [1, beams, T] padded, sequence_length and cum_log_probs [1, beams]."""
    from llm_request import parse_request
    from llm_response import beam_arrays

    from refengine import CompletionOutput, RequestOutput
    from refengine.step_messages import SampledToken

    arrays = {**_arrays(end_id=2), "beam_width": np.array([[3]], dtype=np.int32), "return_log_probs": np.array([[True]])}
    request = parse_request(arrays, exclude_input_default=True, decoupled=False)  # beams need no decoupled mode
    assert request.params.beam_width == 3 and request.params.n == 3  # every beam by default, as TensorRT-LLM
    beams = [((5, 6, 7), -1.5, (-0.5, -0.5, -0.5)), ((5, 8), -1.75, (-0.5, -1.0)), ((9,), -2.0, (-2.0,))]
    output = RequestOutput(
        "r",
        request.prompt_ids,
        tuple(
            CompletionOutput(i, t, t, "stop", logprobs=tuple(SampledToken(a, b) for a, b in zip(t, lp)), cum_log_prob=c) for i, (t, c, lp) in enumerate(beams)
        ),
    )
    got = beam_arrays(request, output)
    assert got["output_ids"].tolist() == [[[5, 6, 7], [5, 8, 2], [9, 2, 2]]]  # padded with the end id
    assert got["sequence_length"].tolist() == [[3, 2, 1]]
    assert got["cum_log_probs"].tolist() == [[-1.5, -1.75, -2.0]] and got["cum_log_probs"].dtype == np.float32
    assert got["output_log_probs"].shape == (1, 3, 3)
    with_prompt = beam_arrays(parse_request(arrays, exclude_input_default=False, decoupled=False), output)
    assert with_prompt["output_ids"][0, 1].tolist() == [1, 317, 289, 5, 8, 2]
    # Streamed (TensorRT-LLM streams beams whole each step): the generated tokens only, whatever
    # exclude_input_in_output says; the prompt's tail precedes every beam for the detokenizer.
    streamed = parse_request({**arrays, "streaming": np.array([[True]])}, exclude_input_default=False, decoupled=True)
    assert streamed.params.beam_width == 3
    step = beam_arrays(streamed, output)
    assert step["output_ids"].tolist() == got["output_ids"].tolist() and step["sequence_length"].tolist() == [[3, 2, 1]]
    assert step["preceding_ids"].tolist() == [[[1, 317, 289]] * 3]
