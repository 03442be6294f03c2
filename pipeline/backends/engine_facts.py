"""What the model repository needs to know about an engine directory, read from its `config.json`.

Both targets write the same keys (TensorRT-LLM 1.2's `version`, `pretrained_config`,
`build_config`), so one reader serves both. Missing keys take TensorRT-LLM's defaults, except the
size limits, which every engine records.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.backends.attention_windows import checkpoint_layer_windows
from pipeline.errors import StageError

CPU_ENGINE_VERSION_PREFIX = "refengine-"
# SpeculativeDecodingMode values an engine's build_config records (tensorrt_llm/models/modeling_utils.py) -> the
# trtllm-build --speculative_decoding_mode name (None: no speculative decoding).
SPECULATIVE_MODE_NAMES = {
    1: None,
    2: "draft_tokens_external",
    4: "medusa",
    8: "lookahead_decoding",
    16: "explicit_draft_tokens",
    32: "eagle",
}
# the other way: the value a BuildConfig records for a --speculative_decoding_mode choice (None: NONE = 1)
SPECULATIVE_DECODING_MODE: dict[str | None, int] = {name: value for value, name in SPECULATIVE_MODE_NAMES.items()}


@dataclass(frozen=True)
class EngineFacts:
    version: str
    architecture: str
    dtype: str
    logits_dtype: str
    vocab_size: int
    tp_size: int
    pp_size: int
    world_size: int
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    max_beam_width: int
    kv_cache_type: str
    gather_context_logits: bool
    gather_generation_logits: bool
    weight_streaming: bool
    tokens_per_block: int
    paged_kv_cache: bool
    context_fmha: bool
    use_paged_context_fmha: bool
    remove_input_padding: bool
    gpt_attention_plugin: str | None
    lora_plugin: str | None = None  # plugin_config.lora_plugin: the LoRA dtype, None without LoRA
    max_lora_rank: int = 64
    lora_target_modules: tuple[str, ...] = ()
    speculative_decoding_mode: str | None = None  # a --speculative_decoding_mode name, None without
    max_draft_len: int = 0
    num_eagle_layers: int = 0  # an EAGLE engine's pretrained_config.num_eagle_layers: its tree's depth
    layer_windows: tuple[int | None, ...] = ()  # per layer, its attention window (None: whole sequence); () none windowed

    @property
    def usable_seq_len(self) -> int:
        """Prompt + output tokens a request may use: trtllm-build adds max_draft_len to a speculative engine's max_seq_len
        (and num_eagle_layers to an EAGLE engine's)."""
        return self.max_seq_len - self.max_draft_len - self.num_eagle_layers if self.speculative_decoding_mode else self.max_seq_len

    @property
    def built_by_refengine(self) -> bool:
        return self.version.startswith(CPU_ENGINE_VERSION_PREFIX)


def read_engine_config(engine_dir: Path) -> dict[str, Any]:
    path = engine_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise StageError(f"{path} does not exist; the engine directory is incomplete") from None
    except (OSError, json.JSONDecodeError) as error:
        raise StageError(f"{path}: unreadable engine config ({error})") from None
    if not isinstance(config, dict):
        raise StageError(f"{path}: engine config must be a JSON object")
    return config


def engine_facts(config: Mapping[str, Any], source: str = "engine config.json") -> EngineFacts:
    """The facts of an engine `config.json` (as a dict); StageError names any missing key."""
    pretrained = _section(config, "pretrained_config", source)
    build = _section(config, "build_config", source)
    plugins = build.get("plugin_config") or {}
    lora = build.get("lora_config") or {}
    mapping = pretrained.get("mapping") or {}
    quantization = pretrained.get("quantization") or {}
    tp_size = int(mapping.get("tp_size", 1))
    pp_size = int(mapping.get("pp_size", 1))
    return EngineFacts(
        version=str(config.get("version", "")),
        architecture=str(pretrained.get("architecture", "")),
        dtype=str(_required(pretrained, "dtype", source, "pretrained_config")),
        logits_dtype=str(pretrained.get("logits_dtype") or "float32"),
        vocab_size=int(_required(pretrained, "vocab_size", source, "pretrained_config")),
        tp_size=tp_size,
        pp_size=pp_size,
        world_size=int(mapping.get("world_size", tp_size * pp_size)),
        quant_algo=quantization.get("quant_algo"),
        kv_cache_quant_algo=quantization.get("kv_cache_quant_algo"),
        max_batch_size=int(_required(build, "max_batch_size", source, "build_config")),
        max_input_len=int(_required(build, "max_input_len", source, "build_config")),
        max_seq_len=int(_required(build, "max_seq_len", source, "build_config")),
        max_num_tokens=int(_required(build, "max_num_tokens", source, "build_config")),
        max_beam_width=int(build.get("max_beam_width", 1)),
        kv_cache_type=str(build.get("kv_cache_type", "PAGED")).upper(),
        gather_context_logits=bool(build.get("gather_context_logits", False)),
        gather_generation_logits=bool(build.get("gather_generation_logits", False)),
        weight_streaming=bool(build.get("weight_streaming", False)),
        tokens_per_block=int(plugins.get("tokens_per_block", 32)),
        paged_kv_cache=bool(plugins.get("paged_kv_cache", True)),
        context_fmha=bool(plugins.get("context_fmha", True)),
        use_paged_context_fmha=bool(plugins.get("use_paged_context_fmha", False)),
        remove_input_padding=bool(plugins.get("remove_input_padding", True)),
        gpt_attention_plugin=plugins.get("gpt_attention_plugin", "auto"),
        lora_plugin=None if plugins.get("lora_plugin") in (None, "disable") else str(plugins["lora_plugin"]),
        max_lora_rank=int(lora.get("max_lora_rank", 64)),
        lora_target_modules=tuple(str(m) for m in lora.get("lora_target_modules") or ()),
        speculative_decoding_mode=_speculative_mode(build.get("speculative_decoding_mode", 1), source),
        max_draft_len=int(build.get("max_draft_len") or 0),
        num_eagle_layers=int(pretrained.get("num_eagle_layers") or 0),
        layer_windows=checkpoint_layer_windows(pretrained),
    )


def _speculative_mode(value: Any, source: str) -> str | None:
    if isinstance(value, str):  # a name, as a BuildConfig dict may hold it
        name = value.lower().removeprefix("speculativedecodingmode.")
        if name == "none":
            return None
        if name in SPECULATIVE_MODE_NAMES.values():
            return name
    elif isinstance(value, int) and value in SPECULATIVE_MODE_NAMES:
        return SPECULATIVE_MODE_NAMES[value]
    raise StageError(f"{source}: build_config.speculative_decoding_mode {value!r} is not a speculative decoding mode this version knows")


def _section(config: Mapping[str, Any], key: str, source: str) -> Mapping[str, Any]:
    section = config.get(key)
    if not isinstance(section, Mapping):
        raise StageError(f"{source}: missing the {key!r} section (not an engine built by TensorRT-LLM 1.2 or the cpu build)")
    return section


def _required(section: Mapping[str, Any], key: str, source: str, section_name: str) -> Any:
    if section.get(key) is None:
        raise StageError(f"{source}: {section_name}.{key} is missing")
    return section[key]
