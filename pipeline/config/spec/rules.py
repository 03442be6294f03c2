"""The spec's cross-section rules: what one section allows depends on another (serve on the engine's plugins,
the quantization formats on the target, LoRA and speculative decoding on the target, the performance gate's
workload on the engine's sizes, deploy.gpus on the ranks). Every message starts with the field it is about and
names the other fields involved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.config.format_rules import check_format_rules
from pipeline.config.spec.kubernetes import check_placement
from pipeline.config.spec.speculative_rules import check_speculative
from pipeline.config.targets import Target, traits_of

if TYPE_CHECKING:
    from pipeline.config.spec import Spec
    from pipeline.config.spec.build import BuildSpec
    from pipeline.config.spec.serve import ServeSpec


def check_cross_section(spec: Spec) -> None:
    build, serve = spec.build, spec.serve
    paged_ctx = build.plugins.use_paged_context_fmha and build.plugins.context_fmha
    for field in ("enable_kv_cache_reuse", "enable_chunked_context"):
        if getattr(serve, field) and not paged_ctx:
            raise ValueError(f"serve.{field}: true needs build.plugins.use_paged_context_fmha: true (and build.plugins.context_fmha: true) in the engine")
    check_format_rules(spec.quantize, build, serve, model_known=False)
    why_every_token = traits_of(build.target).no_stream_interval_because
    if serve.stream_interval > 1 and why_every_token is not None:
        raise ValueError(f"serve.stream_interval: {serve.stream_interval} cannot be served on build.target {build.target.value}: {why_every_token}")
    _check_lora_and_speculative(build, serve)
    from pipeline.config.spec.draft import draft_spec  # it builds a Spec: imported when the Spec is being checked

    draft_spec(spec)
    performance = spec.gate.performance
    if performance is not None and performance.input_tokens > build.max_input_len:
        raise ValueError(f"gate.performance.input_tokens ({performance.input_tokens}) exceeds build.max_input_len ({build.max_input_len})")
    if performance is not None and build.max_seq_len is not None and (performance.input_tokens + performance.output_tokens > build.max_seq_len):
        raise ValueError(
            f"gate.performance.input_tokens + output_tokens ({performance.input_tokens} + {performance.output_tokens}) "
            f"exceeds build.max_seq_len ({build.max_seq_len})"
        )
    ranks = build.tp_size * build.pp_size * serve.instances.tensorrt_llm
    gpus = spec.deploy.gpus
    if traits_of(build.target).places_ranks_on_deploy_gpus and gpus and len(gpus) != ranks:
        raise ValueError(
            f"deploy.gpus lists {len(gpus)} GPU(s) but build.tp_size ({build.tp_size}) × build.pp_size "
            f"({build.pp_size}) × serve.instances.tensorrt_llm ({serve.instances.tensorrt_llm}) = {ranks}"
        )
    check_placement(spec)


def _check_lora_and_speculative(build: BuildSpec, serve: ServeSpec) -> None:
    """LoRA and speculative decoding: only on a target that builds them; serve.lora only with build.lora, and large enough for it."""
    target = build.target
    traits = traits_of(target)
    why_not = {"lora": traits.no_lora_because, "speculative": None if traits.builds_speculative else "it does not build speculative decoding"}
    builders = {
        "lora": [t.value for t in Target if traits_of(t).no_lora_because is None],
        "speculative": [t.value for t in Target if traits_of(t).builds_speculative],
    }
    for section, why in why_not.items():
        if getattr(build, section) is not None and why is not None:
            raise ValueError(
                f"build.{section} is set, but build.target is {target.value}: {why}; use target {' or '.join(builders[section])} or remove build.{section}"
            )
    if build.speculative is not None:
        check_speculative(build, serve)
    lora, serve_lora = build.lora, serve.lora
    if serve_lora is None:
        return
    if lora is None:
        raise ValueError("serve.lora is set, but build.lora is not: the LoRA cache needs an engine built with LoRA")
    largest = serve_lora.cache_max_adapter_size
    if largest is not None and largest < lora.max_rank:
        raise ValueError(
            f"serve.lora.cache_max_adapter_size ({largest}) is below build.lora.max_rank ({lora.max_rank}): adapters of the "
            "ranks the engine accepts would not fit the LoRA cache"
        )
    if largest is None and serve_lora.cache_optimal_adapter_size > lora.max_rank:
        raise ValueError(
            f"serve.lora.cache_optimal_adapter_size ({serve_lora.cache_optimal_adapter_size}) exceeds the LoRA cache's largest "
            f"adapter size, build.lora.max_rank ({lora.max_rank})"
        )
