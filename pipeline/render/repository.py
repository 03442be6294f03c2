"""Write a Triton model repository for an engine directory: configs rendered, code copied, checked.

    <out_dir>/
      preprocessing/      config.pbtxt, 1/model.py (+ helper modules)
      tensorrt_llm/       config.pbtxt, 1/model.py + contract.json (a Python-backend target: cpu) or 1/ (a C++ backend: engine)
      postprocessing/     config.pbtxt, 1/model.py (+ helper modules)
      <serve.model_name>/ config.pbtxt, 1/ (the ensemble; the empty version directory is required)
      tensorrt_llm_bls/   config.pbtxt, 1/model.py + contract.json (+ helper modules)
      tensorrt_llm_draft/ (engine target, draft_tokens_external) the draft engine's LLM model: the BLS drafts with it

Configs and contract.json files (contract_files.py) are rendered from one source, contract.py.

The configs name the engine and tokenizer directories by absolute path (the serve launcher runs
Triton on a private copy of the repository, so relative paths would not survive).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.backends.base import TritonLlmModel
from pipeline.backends.cpu.speculative import SPECULATIVE_KEY
from pipeline.backends.engine_facts import EngineFacts, engine_facts, read_engine_config
from pipeline.backends.llm_parameters import guided_decoding_parameters
from pipeline.backends.registry import backend_for
from pipeline.config.spec import GuidedDecodingBackend, ServeSpec, SpeculativeSpec, Target
from pipeline.errors import StageError
from pipeline.render import contract
from pipeline.render.consistency import check_consistency, check_guided_decoding, llm_model_of
from pipeline.render.contract import TensorSpec
from pipeline.render.contract_files import CONTRACT_FILE, bls_contract, llm_contract
from pipeline.render.llmapi_repository import render_llmapi_repository
from pipeline.render.pbtxt import lint_config, parse_config, render_config, template_environment
from pipeline.render.repository_request import RepositoryRequest
from pipeline.render.tokenizer_facts import TokenizerFacts, tokenizer_facts
from pipeline.render.traffic import traffic_parameters
from pipeline.render.xgrammar_tokenizer_info import FILE_NAME as TOKENIZER_INFO_FILE
from pipeline.render.xgrammar_tokenizer_info import write_tokenizer_info
from pipeline.sources import model_repo_sources

CONFIG_FILE = "config.pbtxt"
VERSION_DIR = "1"

# model directory → (model code in model_repo/python, helper modules copied next to it); tensorrt_llm's is its target's
_MODEL_CODE: dict[str, tuple[str, tuple[str, ...]]] = {
    "preprocessing": ("preprocessing.py", ("hf_tokenizer.py", "model_parameters.py", "triton_io.py", "word_lists.py")),
    "postprocessing": (
        "postprocessing.py",
        ("deferred_release.py", "hf_tokenizer.py", "incremental_detokenizer.py", "model_parameters.py", "postprocessing_pieces.py", "triton_io.py"),
    ),
    "tensorrt_llm_bls": (
        "tensorrt_llm_bls.py",
        (
            "bls_tensors.py",
            "client_contract.py",
            "deferred_release.py",
            "hf_tokenizer.py",
            "incremental_detokenizer.py",
            "model_contract.py",
            "model_parameters.py",
            "response_channel.py",
            "speculative_loop.py",
            "triton_io.py",
        ),
    ),
}
DRAFT_MODEL_NAME = "tensorrt_llm_draft"


@dataclass(frozen=True)
class ConfigPaths:
    """The engine and tokenizer directories as the configs name them (e.g. paths inside a container)."""

    engine_dir: str
    tokenizer_dir: str
    # Where the repository is served from (a container mount). None: where it is written (the final directory);
    # files inside it are named relative to it for a model that reads them there (the cpu model), else absolutely
    # (the engine target's C++ backend opens xgrammar_tokenizer_info_path against tritonserver's working directory).
    model_repository: str | None = None


def render_model_repository(request: RepositoryRequest) -> list[Path]:
    """Check the engine against the serve spec, then write the repository; returns the files written."""
    if request.out_dir.exists() and any(request.out_dir.iterdir()):
        raise StageError(f"{request.out_dir} is not empty; a model repository is written into a new directory")
    paths = request.config_paths or ConfigPaths(str(request.engine_dir.resolve()), str(request.tokenizer_dir.resolve()))
    llm_api = backend_for(request.target).llm_api
    if llm_api is not None:  # NVIDIA's llmapi layout: one model configured by LLM() options, no engine to check
        return render_llmapi_repository(llm_api, engine_dir=request.engine_dir, serve=request.serve, out_dir=request.out_dir, model_path=paths.engine_dir)
    engine_config = read_engine_config(request.engine_dir)
    facts = engine_facts(engine_config, str(request.engine_dir / "config.json"))
    if request.dry_run and not (request.tokenizer_dir / "tokenizer.json").is_file():
        tokenizer = TokenizerFacts(vocab_size=facts.vocab_size, eos_id=None, pad_id=None)
    else:
        tokenizer = tokenizer_facts(request.tokenizer_dir)
    rank_files = None if request.dry_run else sorted(p.name for p in request.engine_dir.glob("rank*.*"))
    draft_config = read_draft_config(request.engine_dir, engine_config, request.draft_engine_dir)
    check_consistency(
        engine_config,
        request.serve,
        request.target,
        tokenizer.vocab_size,
        tokenizer_eos_id=tokenizer.eos_id,
        gpu_device_ids=request.gpu_device_ids,
        rank_files=rank_files,
        speculative=request.speculative,
        draft_engine_config=draft_config,
    )
    llm_model = llm_model_of(request.target)  # the checks refused a target without one
    if paths.model_repository is None and not llm_model.reads_paths_in_repository:
        paths = dataclasses.replace(paths, model_repository=str((request.final_out_dir or request.out_dir).resolve()))
    sources = model_repo_sources()
    tensors = _resolved_tensors(facts, llm_model)
    instances = {
        name: getattr(request.serve.instances, name) or (request.python_instances or {}).get(name) or 1 for name in ("preprocessing", "postprocessing", "bls")
    }
    configs = _configs(facts, tokenizer, request.serve, request.target, llm_model, paths, request.gpu_device_ids, request.speculative, tensors, instances)
    if draft_config is not None and llm_model.serves_draft_model:
        draft_dir = request.draft_config_dir or str(Path(request.draft_engine_dir or "").resolve())
        configs[DRAFT_MODEL_NAME] = _draft_model(
            engine_facts(draft_config), request.serve, request.target, llm_model, draft_dir, request.gpu_device_ids, tensors
        )
        _template, bls_context = configs["tensorrt_llm_bls"]
        bls_context["parameters"]["tensorrt_llm_draft_model_name"] = DRAFT_MODEL_NAME
    contracts = _contracts(tensors)
    environment = template_environment(sources / "templates")
    written: list[Path] = []
    for model_name, (template, context) in configs.items():
        text = render_config(environment, template, context)
        where = f"{model_name}/{CONFIG_FILE}"
        lint_config(text, where)
        parsed = parse_config(text, where)
        if parsed.name != model_name:
            raise StageError(f"{where}: the config names the model {parsed.name!r}, not its directory {model_name!r}")
        model_dir = request.out_dir / model_name
        (model_dir / VERSION_DIR).mkdir(parents=True, exist_ok=True)
        (model_dir / CONFIG_FILE).write_text(text)
        written.append(model_dir / CONFIG_FILE)
        code = _copy_code(sources / "python", model_name, llm_model, model_dir / VERSION_DIR)
        if code and model_name in contracts:  # the contract goes where the code that reads it goes
            (model_dir / VERSION_DIR / CONTRACT_FILE).write_text(contracts[model_name])
            code.append(model_dir / VERSION_DIR / CONTRACT_FILE)
        written += code
    _template, llm_context = configs["tensorrt_llm"]
    written += _guided_decoding_files(request.serve, request.tokenizer_dir, tokenizer, request.out_dir, llm_context["parameters"], request.dry_run)
    return written


def _guided_decoding_files(
    serve: ServeSpec, tokenizer_dir: Path, tokenizer: TokenizerFacts, out_dir: Path, parameters: dict[str, str], dry_run: bool
) -> list[Path]:
    """The xgrammar tokenizer-info file, next to tensorrt_llm's config (a dry run without a tokenizer
    writes none: like the engine, it must be in place before the server starts)."""
    if serve.guided_decoding is GuidedDecodingBackend.none:
        check_guided_decoding(serve, parameters, None)
        return []
    if dry_run and not (tokenizer_dir / "tokenizer.json").is_file():
        return []
    info = write_tokenizer_info(tokenizer_dir, tokenizer.eos_id, out_dir / "tensorrt_llm" / TOKENIZER_INFO_FILE)
    check_guided_decoding(serve, parameters, info)
    return [info]


def _copy_code(code_dir: Path, model_name: str, llm_model: TritonLlmModel, version_dir: Path) -> list[Path]:
    code = llm_model.code if model_name in ("tensorrt_llm", DRAFT_MODEL_NAME) else _MODEL_CODE.get(model_name)
    if code is None:
        return []
    main, helpers = code
    written = []
    for source, name in [(main, "model.py"), *((helper, helper) for helper in helpers)]:
        destination = version_dir / name
        shutil.copyfile(code_dir / source, destination)
        written.append(destination)
    return written


def _text_limits(facts: EngineFacts, tokenizer: TokenizerFacts) -> dict[str, str]:
    """Byte limits the preprocessing model (and the OpenAI front end) check before tokenizing:
    a prompt longer than `max_input_len` tokens can hold, a stop/bad word longer than a whole
    sequence. Unknown without a tokenizer (a dry run): then texts are only checked once tokenized."""
    if tokenizer.max_token_bytes is None:
        return {}
    return {
        "max_prompt_bytes": str(facts.max_input_len * tokenizer.max_token_bytes),
        "max_word_bytes": str(facts.usable_seq_len * tokenizer.max_token_bytes),
    }


def _logits_available(facts: EngineFacts, llm_model: TritonLlmModel) -> dict[str, str]:
    """Whether `tensorrt_llm` can return context / generation logits (the OpenAI front end's prompt and
    top-N log-probs need them). The cpu engine always can; a TensorRT-LLM 1.x engine returns generation
    logits at run time (the build flag is deprecated), context logits only when built with
    gather_context_logits."""
    return {
        "gather_context_logits": "true" if llm_model.always_context_logits or facts.gather_context_logits else "false",
        "gather_generation_logits": "true",
    }


@dataclass(frozen=True)
class _Tensors:
    """The tensors of the models whose lists depend on the engine (data types and target resolved)."""

    llm_inputs: tuple[TensorSpec, ...]
    llm_outputs: tuple[TensorSpec, ...]
    client_inputs: tuple[TensorSpec, ...]
    bls_inputs: tuple[TensorSpec, ...]  # the client inputs and the BLS's own (num_draft_tokens, use_draft_logits)
    client_outputs: tuple[TensorSpec, ...]
    priority: bool  # the ensemble and BLS take a priority and pass it to tensorrt_llm


def _resolved_tensors(facts: EngineFacts, llm_model: TritonLlmModel) -> _Tensors:
    logits = contract.TRITON_DTYPES[facts.logits_dtype]
    # LoRA inputs on tensorrt_llm, the ensemble and the BLS, typed like the engine's LoRA plugin (other dtypes are ignored);
    # declared on every repository, as NVIDIA's templates do (FP16 without a plugin), so that a LoRA request
    # to an engine without adapters gets the backend's answer, and the cpu model's refusal, by name (the checks
    # have refused an engine with a LoRA plugin to a runtime without LoRA).
    lora = contract.TRITON_DTYPES[facts.lora_plugin] if facts.lora_plugin is not None else "TYPE_FP16"

    def resolved(specs):
        return tuple(spec.resolved(logits, lora) for spec in specs)

    draft_inputs = contract.LLM_DRAFT_INPUTS if llm_model.takes_draft_tokens else ()
    priority = contract.CLIENT_PRIORITY_INPUTS if llm_model.takes_priority else ()
    return _Tensors(
        llm_inputs=resolved(
            contract.LLM_INPUTS + draft_inputs + contract.LLM_LORA_INPUTS + (contract.CPU_LLM_EXTRA_INPUTS if llm_model.reads_num_draft_tokens else ())
        ),
        llm_outputs=resolved(contract.LLM_OUTPUTS + (contract.CPU_LLM_EXTRA_OUTPUTS if llm_model.returns_preceding_ids else ())),
        client_inputs=resolved(contract.CLIENT_INPUTS + contract.CLIENT_LORA_INPUTS + priority),
        bls_inputs=resolved(contract.CLIENT_INPUTS + contract.CLIENT_LORA_INPUTS + priority + contract.BLS_SPECULATIVE_INPUTS),
        client_outputs=resolved(contract.CLIENT_OUTPUTS),
        priority=llm_model.takes_priority,
    )


def _contracts(tensors: _Tensors) -> dict[str, str]:
    """contract.json of each model whose code reads one (written only where that code is copied)."""
    return {
        "tensorrt_llm": llm_contract(tensors.llm_inputs, tensors.llm_outputs),
        "tensorrt_llm_bls": bls_contract(tensors.bls_inputs, tensors.client_outputs, tensors.priority),
    }


def _configs(
    facts: EngineFacts,
    tokenizer: TokenizerFacts,
    serve: ServeSpec,
    target: Target,
    llm_model: TritonLlmModel,
    paths: ConfigPaths,
    gpu_device_ids: Sequence[int],
    speculative: SpeculativeSpec | None,
    tensors: _Tensors,
    instances: Mapping[str, int],
) -> dict[str, tuple[str, dict[str, Any]]]:
    max_batch_size = facts.max_batch_size

    def context(**values):
        return {"max_batch_size": max_batch_size, "serve": serve, "instances": instances, **values}

    llm_parameters = backend_for(target).llm_parameters(facts, serve, engine_dir=paths.engine_dir, gpu_device_ids=gpu_device_ids, speculative=speculative)
    tokenizer_info_path = f"tensorrt_llm/{TOKENIZER_INFO_FILE}"
    if paths.model_repository is not None:
        tokenizer_info_path = f"{paths.model_repository}/{tokenizer_info_path}"
    llm_parameters.update(guided_decoding_parameters(serve, tokenizer_dir=paths.tokenizer_dir, tokenizer_info_path=tokenizer_info_path))
    return {
        "preprocessing": (
            "preprocessing.pbtxt.j2",
            context(
                inputs=contract.PREPROCESSING_INPUTS,
                outputs=contract.PREPROCESSING_OUTPUTS,
                parameters={
                    "tokenizer_dir": paths.tokenizer_dir,
                    "add_special_tokens": "true",
                    "max_input_len": str(facts.max_input_len),
                    "max_seq_len": str(facts.usable_seq_len),
                    **_text_limits(facts, tokenizer),
                    **_logits_available(facts, llm_model),
                    **traffic_parameters(serve),
                },
            ),
        ),
        "tensorrt_llm": (llm_model.template, context(inputs=tensors.llm_inputs, outputs=tensors.llm_outputs, parameters=llm_parameters)),
        "postprocessing": (
            "postprocessing.pbtxt.j2",
            context(
                inputs=contract.POSTPROCESSING_INPUTS,
                outputs=contract.POSTPROCESSING_OUTPUTS,
                parameters={"tokenizer_dir": paths.tokenizer_dir, "skip_special_tokens": "true", "llm_model_name": "tensorrt_llm"},
            ),
        ),
        serve.model_name: (
            "ensemble.pbtxt.j2",
            context(
                name=serve.model_name,
                inputs=tensors.client_inputs,
                outputs=tensors.client_outputs,
                steps=_ensemble_steps(llm_model.returns_preceding_ids, tensors.priority),
            ),
        ),
        "tensorrt_llm_bls": (
            "tensorrt_llm_bls.pbtxt.j2",
            context(
                inputs=tensors.bls_inputs,
                outputs=tensors.client_outputs,
                parameters={
                    "max_draft_len": str(facts.max_draft_len if facts.speculative_decoding_mode == "draft_tokens_external" else 0),
                    "preprocessing_model_name": "preprocessing",
                    "tensorrt_llm_model_name": "tensorrt_llm",
                    "postprocessing_model_name": "postprocessing",
                    "exclude_input_in_output": "true" if serve.exclude_input_in_output else "false",
                    # the BLS decodes its deltas itself (tensorrt_llm_bls.py): one server round trip per token less
                    "tokenizer_dir": paths.tokenizer_dir,
                    "skip_special_tokens": "true",
                },
            ),
        ),
    }


def read_draft_config(engine_dir: Path, engine_config: Mapping[str, Any], draft_engine_dir: Path | None) -> dict[str, Any] | None:
    """The draft engine's config.json: the draft stage's engine, or the one a cpu engine carries (refengine_speculative's
    draft_engine_dir, relative to the engine directory); None without a draft."""
    carried = (engine_config.get(SPECULATIVE_KEY) or {}).get("draft_engine_dir")
    directory = engine_dir / carried if carried else draft_engine_dir
    return read_engine_config(directory) if directory is not None else None


def _draft_model(
    draft: EngineFacts,
    serve: ServeSpec,
    target: Target,
    llm_model: TritonLlmModel,
    engine_dir: str,
    gpu_device_ids: Sequence[int],
    tensors: _Tensors,
) -> tuple[str, dict[str, Any]]:
    """tensorrt_llm_draft: NVIDIA's tensorrt_llm template for the draft engine (examples/draft_target_model/README.md:
    a copy of tensorrt_llm renamed, filled with the draft's engine_dir), on the same GPUs, sized by the draft engine."""
    parameters = backend_for(target).llm_parameters(draft, serve, engine_dir=engine_dir, gpu_device_ids=gpu_device_ids, speculative=None)
    return llm_model.template, {
        "name": DRAFT_MODEL_NAME,
        "max_batch_size": draft.max_batch_size,
        "serve": serve,
        "inputs": tensors.llm_inputs,
        "outputs": tensors.llm_outputs,
        "parameters": parameters,
    }


def _internal(name: str) -> str:
    return f"_{name}"


def _ensemble_steps(preceding_ids: bool, priority: bool) -> dict[str, dict[str, dict[str, str]]]:
    """input_map / output_map of each step: model tensor name → ensemble tensor name."""
    llm_to_post = {**contract.LLM_TO_POSTPROCESSING, **(contract.CPU_LLM_TO_POSTPROCESSING if preceding_ids else {})}
    llm_inputs = {llm: _internal(pre) for pre, llm in contract.PREPROCESSING_TO_LLM.items()}
    llm_inputs.update({llm: client for client, llm in contract.CLIENT_TO_LLM.items()})
    llm_inputs.update({llm: client for client, llm in contract.LORA_CLIENT_TO_LLM.items()})
    llm_inputs.update({llm: client for client, llm in contract.PRIORITY_CLIENT_TO_LLM.items() if priority})
    llm_outputs = {llm: _internal(post) for llm, post in llm_to_post.items()}
    llm_outputs.update(contract.LLM_TO_CLIENT)
    return {
        "preprocessing": {
            "inputs": {pre: client for client, pre in contract.CLIENT_TO_PREPROCESSING.items()},
            "outputs": {pre: _internal(pre) for pre in contract.PREPROCESSING_TO_LLM},
        },
        "tensorrt_llm": {"inputs": llm_inputs, "outputs": llm_outputs},
        "postprocessing": {
            "inputs": {post: _internal(post) for post in llm_to_post.values()},
            "outputs": {"OUTPUT": "text_output"},
        },
    }
