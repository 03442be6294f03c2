"""Engine ↔ Triton consistency, checked before a repository is written: what NVIDIA's `tensorrtllm` backend reads
from the engine's config.json must agree with the repository (sources:
triton-inference-server/tensorrtllm_backend docs/model_config.md, inflight_batcher_llm/src/model_instance_state.cc).

Every failed check becomes one line naming both sides and their values; all lines are raised
together in one StageError, so one run shows everything to fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.backends.base import RuntimeAbilities, TargetBackend, TritonLlmModel
from pipeline.backends.engine_facts import EngineFacts, engine_facts
from pipeline.backends.llm_parameters import decoding_mode, lora_cache
from pipeline.backends.registry import backend_for
from pipeline.config.spec import ServeSpec, SpeculativeSpec, Target
from pipeline.config.targets import traits_of
from pipeline.errors import StageError
from pipeline.quant_formats import kv_cache_format_named, paged_context_fmha_loss, weight_format_named
from pipeline.render.contract import TRITON_DTYPES
from pipeline.render.draft_consistency import draft_problems
from pipeline.speculative.registry import rules_for

FIXED_MODEL_NAMES = ("preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls")


def check_consistency(
    engine_config: Mapping[str, Any],
    serve: ServeSpec,
    target: Target | str,
    tokenizer_vocab_size: int,
    *,
    tokenizer_eos_id: int | None = None,
    triton_max_batch_size: int | None = None,
    max_beam_width: int | None = None,
    gpu_device_ids: Sequence[int] = (),
    rank_files: Sequence[str] | None = None,
    logits_datatype: str | None = None,
    speculative: SpeculativeSpec | None = None,
    lora_weights_datatype: str | None = None,
    draft_engine_config: Mapping[str, Any] | None = None,
) -> None:
    """Raise StageError listing every way the repository would not match the engine.

    `triton_max_batch_size` and `max_beam_width` default to the engine's own limits (what the
    renderer writes); `rank_files` are the weight files found in the engine directory (None: not
    checked); `logits_datatype` / `lora_weights_datatype` are Triton types a caller wants instead of
    the engine's; `speculative` is the spec's build.speculative (the Triton lookahead parameters).
    """
    runtime = llm_model_of(target).runtime
    target = Target(target)
    facts = engine_facts(engine_config)
    problems: list[str] = []
    problems += _engine_kind(facts, target, runtime)
    problems += _batching(facts, serve, triton_max_batch_size)
    problems += _streaming(serve)
    problems += _paged_context_features(facts, serve)
    problems += _lengths(facts, serve)
    problems += _logits(facts, logits_datatype)
    problems += _lora(facts, serve, target, runtime, lora_weights_datatype)
    problems += _speculative(facts, speculative, target, runtime)
    problems += draft_problems(facts, serve, draft_engine_config)
    problems += _tokenizer(facts, tokenizer_vocab_size, tokenizer_eos_id)
    problems += _beams(facts, target, runtime, max_beam_width)
    problems += _parallelism(facts, serve, target, runtime, gpu_device_ids, rank_files)
    problems += _names(serve)
    if problems:
        listing = "\n".join(f"  - {problem}" for problem in problems)
        raise StageError(
            f"the Triton model repository would not match the engine ({len(problems)} problem(s)):\n{listing}",
            hint="change the serve section of the build config, or rebuild the engine with matching build settings",
        )


def llm_model_of(target: Target | str) -> TritonLlmModel:
    """The `tensorrt_llm` model of the target's repository; StageError when the target has none."""
    backend = _backend(target)
    if backend is None or backend.llm_model is None:
        rendered = sorted(t.value for t in Target if backend_for(t).llm_model is not None)
        name = target.value if isinstance(target, Target) else target
        raise StageError(f"build.target {name!r} has no Triton model repository in this version (expected one of {', '.join(rendered)})")
    return backend.llm_model


def _backend(target: Target | str) -> TargetBackend | None:
    try:
        return backend_for(Target(target))
    except ValueError:
        return None


def _engine_kind(facts: EngineFacts, target: Target, runtime: RuntimeAbilities) -> list[str]:
    if facts.built_by_refengine != runtime.runs_refengine_engines:
        return [f"build.target is {target.value} but the engine config version is {facts.version!r}: {runtime.other_engine_kind}"]
    return []


def _batching(facts: EngineFacts, serve: ServeSpec, triton_max_batch_size: int | None) -> list[str]:
    problems = []
    if triton_max_batch_size is not None and triton_max_batch_size > facts.max_batch_size:
        problems.append(f"Triton max_batch_size {triton_max_batch_size} exceeds the engine's build_config.max_batch_size {facts.max_batch_size}")
    if facts.kv_cache_type != "PAGED" or not facts.paged_kv_cache:
        problems.append(
            f"inflight batching needs a paged KV cache, but the engine has build_config.kv_cache_type {facts.kv_cache_type!r} "
            f"(plugin_config.paged_kv_cache {facts.paged_kv_cache})"
        )
    if not facts.remove_input_padding:
        problems.append("inflight batching needs plugin_config.remove_input_padding true, but the engine has false")
    if facts.gpt_attention_plugin in (None, "disable"):
        problems.append(
            f"inflight batching needs the GPT attention plugin, but the engine has plugin_config.gpt_attention_plugin {facts.gpt_attention_plugin!r}"
        )
    return problems


def _streaming(serve: ServeSpec) -> list[str]:
    if serve.streaming and not serve.decoupled:
        return ["serve.streaming is true but serve.decoupled is false: Triton streams responses only from decoupled models"]
    return []


def _paged_context_features(facts: EngineFacts, serve: ServeSpec) -> list[str]:
    problems = []
    kv = kv_cache_format_named(facts.kv_cache_quant_algo)
    loss = paged_context_fmha_loss(weight_format_named(facts.quant_algo), kv) if kv is not None else None
    for field in ("enable_kv_cache_reuse", "enable_chunked_context"):
        if not getattr(serve, field):
            continue
        if not (facts.use_paged_context_fmha and facts.context_fmha):
            problems.append(
                f"serve.{field} is true but the engine has plugin_config.use_paged_context_fmha "
                f"{facts.use_paged_context_fmha} (context_fmha {facts.context_fmha}); it needs paged context FMHA"
            )
        if loss is not None and kv is not None:  # loss is None whenever kv is
            weights = f" with quantization.quant_algo {facts.quant_algo}" if loss == "weights" else ""
            problems.append(
                f"serve.{field} is true but the engine has quantization.kv_cache_quant_algo {kv.trtllm_kv_quant_algo}"
                f"{weights}, which turns paged context FMHA off"
            )
    return problems


def _lengths(facts: EngineFacts, serve: ServeSpec) -> list[str]:
    problems = []
    if facts.max_input_len >= facts.max_seq_len:
        problems.append(
            f"engine build_config.max_input_len {facts.max_input_len} is not below build_config.max_seq_len "
            f"{facts.max_seq_len}: a full-length prompt leaves no room for output"
        )
    if not serve.enable_chunked_context and facts.max_num_tokens < facts.max_input_len:
        problems.append(
            f"serve.enable_chunked_context is false and the engine's build_config.max_num_tokens {facts.max_num_tokens} "
            f"is below build_config.max_input_len {facts.max_input_len}: prompts longer than max_num_tokens would be refused"
        )
    return problems


def _logits(facts: EngineFacts, logits_datatype: str | None) -> list[str]:
    expected = TRITON_DTYPES.get(facts.logits_dtype)
    if expected is None:
        return [f"engine pretrained_config.logits_dtype {facts.logits_dtype!r} has no Triton data type (known: {', '.join(TRITON_DTYPES)})"]
    if logits_datatype is not None and logits_datatype != expected:
        return [f"Triton logits data type {logits_datatype} does not match the engine's pretrained_config.logits_dtype {facts.logits_dtype!r} ({expected})"]
    return []


def _lora(facts: EngineFacts, serve: ServeSpec, target: Target, runtime: RuntimeAbilities, lora_weights_datatype: str | None) -> list[str]:
    """LoRA requests need an engine built with the LoRA plugin, weights in its dtype, a cache for its ranks."""
    if facts.lora_plugin is None:
        if serve.lora is not None:
            return [
                "serve.lora sets the LoRA cache, but the engine has plugin_config.lora_plugin null (built without LoRA): "
                "rebuild with build.lora, or remove serve.lora"
            ]
        return []
    if not runtime.lora:
        return [f"build.target is {target.value} but the engine has plugin_config.lora_plugin {facts.lora_plugin!r}: {runtime.name} does not run LoRA"]
    problems = []
    expected = TRITON_DTYPES.get(facts.lora_plugin)
    if expected is None:
        problems.append(f"engine plugin_config.lora_plugin {facts.lora_plugin!r} has no Triton data type for lora_weights (known: {', '.join(TRITON_DTYPES)})")
    elif lora_weights_datatype is not None and lora_weights_datatype != expected:
        problems.append(
            f"Triton lora_weights data type {lora_weights_datatype} does not match the engine's plugin_config.lora_plugin "
            f"{facts.lora_plugin!r} ({expected}): adapter weights in another dtype are silently ignored"
        )
    _, largest, _, _ = lora_cache(serve, facts.max_lora_rank)
    if largest < facts.max_lora_rank:
        problems.append(
            f"serve.lora.cache_max_adapter_size (lora_cache_max_adapter_size {largest}) is below the engine's "
            f"build_config.lora_config.max_lora_rank {facts.max_lora_rank}: adapters of the ranks the engine accepts would not fit"
        )
    if not facts.lora_target_modules:
        problems.append("engine plugin_config.lora_plugin is set but build_config.lora_config.lora_target_modules is empty: the engine has no LoRA inputs")
    return problems


def _speculative(facts: EngineFacts, speculative: SpeculativeSpec | None, target: Target, runtime: RuntimeAbilities) -> list[str]:
    """Triton's decoding_mode and lookahead parameters must agree with the engine's speculative mode."""
    engine_mode = facts.speculative_decoding_mode
    spec_mode = speculative.mode.value if speculative is not None else None
    if not runtime.speculative_decoding:
        return [f"build.target is {target.value} but the engine has build_config.speculative_decoding_mode {engine_mode}"] if engine_mode else []
    if engine_mode != (speculative.engine_mode if speculative is not None else None):
        return [
            f"the engine has build_config.speculative_decoding_mode {engine_mode or 'none'} (max_draft_len {facts.max_draft_len}) "
            f"but build.speculative.mode is {spec_mode or 'absent'}: Triton's decoding_mode ({decoding_mode(facts)}) and "
            "its lookahead parameters come from build.speculative and must agree with the engine"
        ]
    if speculative is None:  # and so engine_mode is None too: they are equal
        return []
    return rules_for(speculative.mode).consistency_problems(facts, speculative)


def _tokenizer(facts: EngineFacts, tokenizer_vocab_size: int, eos_id: int | None) -> list[str]:
    problems = []
    if tokenizer_vocab_size > facts.vocab_size:
        problems.append(
            f"the tokenizer has {tokenizer_vocab_size} token ids but the engine's pretrained_config.vocab_size is "
            f"{facts.vocab_size}: the tokenizer belongs to a different model"
        )
    if eos_id is not None and eos_id >= facts.vocab_size:
        problems.append(f"the tokenizer's eos token id {eos_id} (the default end_id) is outside the engine's vocab_size {facts.vocab_size}")
    return problems


def _beams(facts: EngineFacts, target: Target, runtime: RuntimeAbilities, max_beam_width: int | None) -> list[str]:
    problems = []
    if max_beam_width is not None and max_beam_width > facts.max_beam_width:
        problems.append(f"Triton max_beam_width {max_beam_width} exceeds the engine's build_config.max_beam_width {facts.max_beam_width}")
    if not runtime.beam_search and facts.max_beam_width != 1:
        problems.append(
            f"build.target is {target.value} but the engine's build_config.max_beam_width is {facts.max_beam_width}: {runtime.name} does not do beam search (1)"
        )
    return problems


def _parallelism(
    facts: EngineFacts,
    serve: ServeSpec,
    target: Target,
    runtime: RuntimeAbilities,
    gpu_device_ids: Sequence[int],
    rank_files: Sequence[str] | None,
) -> list[str]:
    problems = []
    ranks = facts.tp_size * facts.pp_size
    if facts.world_size != ranks:
        problems.append(f"engine mapping.world_size {facts.world_size} differs from tp_size {facts.tp_size} × pp_size {facts.pp_size} = {ranks}")
    if not runtime.multiple_ranks and ranks != 1:
        problems.append(
            f"build.target is {target.value} but the engine has tp_size {facts.tp_size} × pp_size {facts.pp_size} = {ranks} ranks: {runtime.name} runs one rank"
        )
    if rank_files is not None:
        expected = [f"rank{i}{runtime.weight_suffix}" for i in range(facts.world_size)]
        missing = [name for name in expected if name not in rank_files]
        if missing:
            problems.append(f"engine mapping.world_size {facts.world_size} needs {', '.join(expected)} but the engine directory lacks {', '.join(missing)}")
    if traits_of(target).places_ranks_on_deploy_gpus:  # instances × ranks go on deploy.gpus (gpu_device_ids)
        instances = serve.instances.tensorrt_llm
        needed = ranks * instances
        if gpu_device_ids and len(gpu_device_ids) != needed:
            problems.append(
                f"deploy.gpus lists {len(gpu_device_ids)} GPU(s) but tp_size {facts.tp_size} × pp_size {facts.pp_size} × "
                f"serve.instances.tensorrt_llm {instances} = {needed} are needed"
            )
        if not gpu_device_ids and instances > 1:
            problems.append(
                f"serve.instances.tensorrt_llm is {instances} but deploy.gpus is empty: each instance needs its own "
                f"{ranks} GPU(s) (gpu_device_ids), {needed} in all"
            )
    return problems


def _names(serve: ServeSpec) -> list[str]:
    if serve.model_name in FIXED_MODEL_NAMES:
        return [f"serve.model_name {serve.model_name!r} is the name of another model in the repository ({', '.join(FIXED_MODEL_NAMES)})"]
    return []


def check_guided_decoding(serve: ServeSpec, parameters: Mapping[str, str], written: Path | None) -> None:
    """The rendered tensorrt_llm parameters against serve.guided_decoding: the backend named, and the
    tokenizer-info file it names (`written`: the file the package stage wrote, None if none)."""
    problems = []
    wanted = serve.guided_decoding.value
    rendered = parameters.get("guided_decoding_backend", "none")
    if rendered != wanted:
        problems.append(f"serve.guided_decoding is {wanted}, but tensorrt_llm's guided_decoding_backend is {rendered}")
    named = parameters.get("xgrammar_tokenizer_info_path")
    if wanted != "none":
        if written is None or not written.is_file():
            problems.append(f"xgrammar_tokenizer_info_path names {named!r}, but no tokenizer-info file was written")
        elif named is None or Path(named).parts[-2:] != (written.parent.name, written.name):
            problems.append(f"xgrammar_tokenizer_info_path names {named!r}, not the file written ({written.parent.name}/{written.name})")
        if not parameters.get("tokenizer_dir"):
            problems.append("guided decoding needs tensorrt_llm's tokenizer_dir (the Python backend loads the tokenizer from it)")
    if problems:
        raise StageError("guided decoding would not work: " + "; ".join(problems))
