"""The draft model of draft_tokens_external as a spec of its own: the model's spec with the draft's source, dtype,
quantization and build limits, and no speculation, LoRA or gates. The draft stage quantizes and builds it with the
same code as the model (pipeline.stages.draft), and validating it applies every rule of the model's sections to the
draft (the quantization formats on the target, the build limits, ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

if TYPE_CHECKING:
    from pipeline.config.spec import Spec

DRAFT_SUFFIX = "-draft"
_NAME_LENGTH = 64


def draft_spec(spec: Spec) -> Spec | None:
    """The draft's spec (None without a draft). Reads spec.name, model.dtype, quantize, build, the serve switches the
    build reads (enable_kv_cache_reuse, enable_chunked_context, instances.tensorrt_llm) and deploy.gpu / gpus / shm_size:
    pipeline.plan's draft stage hashes exactly these. Raises ValueError naming build.speculative.draft."""
    from pipeline.config.spec import Spec

    build = spec.build
    speculative = build.speculative
    if speculative is None or speculative.draft is None:
        return None
    draft = speculative.draft
    target_max_seq_len = build.max_seq_len
    limits: dict[str, Any] = {
        "max_batch_size": draft.max_batch_size or build.max_batch_size,
        "max_input_len": draft.max_input_len or build.max_input_len,
        "max_num_tokens": draft.max_num_tokens or build.max_num_tokens,
        "max_seq_len": draft.max_seq_len or (target_max_seq_len + speculative.draft_len if target_max_seq_len is not None else None),
    }
    build_section = build.model_dump(mode="json", exclude={"speculative", "lora"})
    build_section.update(limits, gather_context_logits=False)
    quantize = spec.quantize.model_dump(mode="json")
    quantize.update(algo=draft.quantize.algo.value, kv_cache=draft.quantize.kv_cache.value)
    serve = spec.serve
    data = {
        "name": spec.name[: _NAME_LENGTH - len(DRAFT_SUFFIX)] + DRAFT_SUFFIX,
        "model": {"source": str(draft.source), "dtype": (draft.dtype or spec.model.dtype).value},
        "quantize": quantize,
        "build": build_section,
        "serve": {
            "enable_kv_cache_reuse": serve.enable_kv_cache_reuse,
            "enable_chunked_context": serve.enable_chunked_context,
            "instances": {"tensorrt_llm": serve.instances.tensorrt_llm},
        },
        "deploy": {"gpu": spec.deploy.gpu.value if spec.deploy.gpu is not None else None, "gpus": list(spec.deploy.gpus), "shm_size": spec.deploy.shm_size},
    }
    try:
        return Spec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_named(error) for error in exc.errors())
        raise ValueError(f"build.speculative.draft: as a model of its own, {problems}") from None


def _named(error: Any) -> str:
    """A draft spec's error in the terms of the user's YAML: quantize.algo is the draft's quantize.algo, and so on."""
    message = str(error.get("msg", "")).removeprefix("Value error, ")
    where = ".".join(str(part) for part in error.get("loc", ()))
    return f"{where}: {message}" if where and not message.startswith(where) else message
