"""Hugging Face Llama-family checkpoint -> (optional ModelOpt PTQ) -> TensorRT-LLM checkpoint.

Uses `modelopt.torch.export.export_tensorrt_llm_checkpoint` (ModelOpt 0.47, deprecated from 0.48 and
removed in 0.49; quantization.md §1, §7). In one CPU process ModelOpt writes every rank: with a
single calibration process it splits the model itself (`postprocess_model_config` ->
`_split_model_config_for_tp/_pp`) and the export loop saves `rank{N}.safetensors` for
N = tp_rank + pp_rank * tp_size; `config.json` is written once (by the last rank).

`device` is where the model is loaded and calibrated: `cpu`, or `cuda` (this host's GPU, or the GPU
of NVIDIA's TensorRT-LLM image when `pipeline.backends.quantize_job` runs there). Those images ship an
older ModelOpt (TensorRT-LLM 1.1/1.2 pin `nvidia-modelopt~=0.37`), whose `quant_cfg` is a dict of
pattern -> quantizer config instead of 0.47's list of entries; `_mtq_config` writes either shape.

ModelOpt is imported inside the functions (`import modelopt` takes ~6 s).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.backends.trtllm_checkpoint import trtllm_to_hf_state_dict
from pipeline.errors import StageError
from pipeline.quant_formats import KV_CACHE_FORMATS, WEIGHT_FORMATS, kv_cache_format, needs_calibration, weight_format
from refengine.architectures import HF_MODEL_TYPES, Architecture, architecture_for_hf_model_type

__all__ = ["QuantRecipe", "export_trtllm_checkpoint", "resolve_device", "rope_config_fields", "trtllm_to_hf_state_dict"]

log = logging.getLogger(__name__)

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class QuantRecipe:
    algo: str  # a quantize.algo value (a key of quant_formats.WEIGHT_FORMATS: its ModelOpt config and quant_algo)
    kv_cache: str = "none"  # a quantize.kv_cache value (quant_formats.KV_CACHE_FORMATS)
    group_size: int = 128  # AWQ block size along the input dim


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "chat_template.jinja")
_BENIGN_WARNINGS = (
    "Cannot export tensorrt_llm checkpoint config",  # no tensorrt_llm here: ModelOpt writes config.json itself
    "Enable lm_head quantization",  # printed although lm_head stays unquantized (exclude_modules lists it)
    "lm_head is not calibrated, skip smoothing",  # int8_sq: lm_head is excluded on purpose
)


def export_trtllm_checkpoint(
    hf_dir: Path,
    out_dir: Path,
    *,
    dtype: str,
    tp_size: int,
    pp_size: int,
    quant: QuantRecipe | None = None,
    forward_loop: Callable[[torch.nn.Module], Any] | None = None,
    unified_hf_dir: Path | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """Export `hf_dir` as a TensorRT-LLM checkpoint into `out_dir`; return the written config.json.

    With `unified_hf_dir`, the same calibrated model is also exported as ModelOpt's unified Hugging
    Face checkpoint (what TensorRT-LLM's PyTorch backend loads), after the TRT-LLM export because
    `export_hf_checkpoint` changes the model in place (quantization.md §7).

    `dtype` (float16 | bfloat16) is the dtype of the model while loading/calibrating and of the
    unquantized tensors in the checkpoint. `forward_loop(model)` runs the calibration batches; it is
    needed whenever `quant` asks for ModelOpt PTQ (every algo except none / int8_wo without KV quant);
    it receives the model on `device` and must put its batches there.
    """
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    quant = quant or QuantRecipe("none")
    hf_config = _read_hf_config(hf_dir)
    # ModelOpt's `decoder_type` from the architecture table (ModelOpt's own `MODEL_NAME_TO_TYPE` maps
    # the classes Llama*/Mistral* -> "llama" and QWen*/Qwen2* -> "qwen").
    architecture = architecture_for_hf_model_type(hf_config["model_type"])
    decoder_type = architecture.checkpoint_decoder
    _check_request(hf_config, out_dir, dtype=dtype, tp_size=tp_size, pp_size=pp_size, quant=quant)
    mtq_config = _mtq_config(quant) if _needs_ptq(quant) else None
    if mtq_config is not None and forward_loop is None:
        raise StageError(
            f"quantize: algo {quant.algo!r} with kv_cache {quant.kv_cache!r} needs calibration batches",
            hint="pass forward_loop (quantize.calibration in the build config)",
        )

    torch_device = resolve_device(device)
    model = _load_model(hf_dir, TORCH_DTYPES[dtype])
    if torch_device.type != "cpu":
        with _step("load", f"moving the model to {torch_device}"):
            model = model.to(torch_device)
    if mtq_config is not None:
        import modelopt.torch.quantization as mtq

        with _step("quantize", f"mtq.quantize ({quant.algo}, kv_cache {quant.kv_cache})"):
            model = mtq.quantize(model, mtq_config, forward_loop)

    from modelopt.torch.export import export_tensorrt_llm_checkpoint as modelopt_export

    out_dir.mkdir(parents=True, exist_ok=True)
    with _step("export", "export_tensorrt_llm_checkpoint"), torch.no_grad():
        modelopt_export(
            model,
            decoder_type,
            dtype=TORCH_DTYPES[dtype],
            export_dir=out_dir,
            inference_tensor_parallel=tp_size,  # the default 0 -> ZeroDivisionError (quantization.md §7)
            inference_pipeline_parallel=pp_size,
        )
    config = _finish_config(out_dir, model.config, hf_config, architecture, quant)
    if unified_hf_dir is not None:
        from modelopt.torch.export import export_hf_checkpoint

        with _step("export", "export_hf_checkpoint"), torch.no_grad():
            export_hf_checkpoint(model, dtype=TORCH_DTYPES[dtype], export_dir=unified_hf_dir)
        for name in _TOKENIZER_FILES:  # the unified export does not copy the tokenizer
            if (hf_dir / name).is_file():
                shutil.copy2(hf_dir / name, Path(unified_hf_dir) / name)
    return config


def resolve_device(device: str) -> torch.device:
    """`cpu` or `cuda[:N]` as a torch device; `cuda` when torch sees no CUDA device is refused, naming quantize.device."""
    if device != "cpu" and not device.startswith("cuda"):
        raise StageError(f"quantize.device {device!r} is not cpu or cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
        raise StageError(
            f"quantize.device is {device}, but torch {torch.__version__} ({build}) sees no CUDA device here",
            hint="run on a GPU host, use build.runner docker (the GPU is in the container), or set quantize.device: cpu",
        )
    return torch.device(device)


def rope_config_fields(hf_config: Any) -> dict[str, Any]:
    """`rotary_base` / `rotary_scaling` for config.json from a loaded HF config.

    ModelOpt 0.47 reads `rope_theta` / `rope_scaling` attributes, which transformers 5 folded into
    `rope_parameters`; without this patch config.json has no rotary_base and TRT-LLM silently uses
    10000 (wrong for Llama 3's 500000, Qwen2's 1e6) and drops any RoPE scaling.
    """
    params = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    theta = params.pop("rope_theta", None) or getattr(hf_config, "rope_theta", None) or 10000.0
    fields: dict[str, Any] = {"rotary_base": float(theta)}
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type != "default":
        fields["rotary_scaling"] = {**params, "type": rope_type, "rope_type": rope_type}
    return fields


def _read_hf_config(hf_dir: Path) -> dict[str, Any]:
    path = hf_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        hint = "model.path must be a local HF checkpoint directory"
        raise StageError(f"load: cannot read {path}: {exc}", hint=hint) from exc
    model_type = config.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        arch = " (" + ", ".join(config["architectures"]) + ")" if config.get("architectures") else ""
        raise StageError(
            f"model_type {model_type!r}{arch} is not supported by the TensorRT-LLM checkpoint export; "
            f"supported: {', '.join(HF_MODEL_TYPES)}",
            hint="use a Llama, Mistral or Qwen2 checkpoint",
        )
    return config


def _check_request(
    hf: dict[str, Any], out_dir: Path, *, dtype: str, tp_size: int, pp_size: int, quant: QuantRecipe
) -> None:
    """Reject what ModelOpt would reject with a bare AssertionError, or silently export wrongly."""
    problems = []
    if dtype not in TORCH_DTYPES:
        problems.append(f"dtype {dtype!r} is not one of {', '.join(TORCH_DTYPES)}")
    if quant.algo not in WEIGHT_FORMATS:
        problems.append(f"quantization algo {quant.algo!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    if quant.kv_cache not in KV_CACHE_FORMATS:
        problems.append(f"kv_cache {quant.kv_cache!r} is not one of {', '.join(KV_CACHE_FORMATS)}")
    if tp_size < 1 or pp_size < 1:
        problems.append(f"tp_size {tp_size} and pp_size {pp_size} must be >= 1")
    else:
        heads = int(hf["num_attention_heads"])
        kv_heads = int(hf.get("num_key_value_heads") or heads)
        layers, inter = int(hf["num_hidden_layers"]), int(hf.get("intermediate_size") or 0)
        if heads % tp_size:
            problems.append(f"num_attention_heads {heads} is not divisible by tp_size {tp_size}")
        if kv_heads % tp_size and tp_size % kv_heads:
            problems.append(f"num_key_value_heads {kv_heads} and tp_size {tp_size}: neither divides the other")
        if inter % tp_size:
            problems.append(f"intermediate_size {inter} is not divisible by tp_size {tp_size}")
        if layers % pp_size:
            problems.append(f"num_hidden_layers {layers} is not divisible by pp_size {pp_size}")
    if problems:
        raise StageError(
            "TensorRT-LLM checkpoint export: " + "; ".join(problems),
            hint="change build.tp_size / build.pp_size or the quantize block",
        )
    stale = [p.name for p in out_dir.glob("*") if p.name == "config.json" or p.name.endswith(".safetensors")]
    if stale:
        raise StageError(
            f"export: {out_dir} already holds a checkpoint ({', '.join(sorted(stale))})",
            hint="export into a fresh directory",
        )


def _needs_ptq(quant: QuantRecipe) -> bool:
    return needs_calibration(weight_format(quant.algo), kv_cache_format(quant.kv_cache))


def _mtq_config(quant: QuantRecipe) -> dict[str, Any]:
    """The ModelOpt 0.47 config for `quant` (a deep copy; 0.47's `quant_cfg` is a list of entries)."""
    import modelopt.torch.quantization as mtq

    weights = weight_format(quant.algo)
    config = copy.deepcopy(getattr(mtq, weights.modelopt_config)) if weights.modelopt_config else {"quant_cfg": None}
    legacy = isinstance(config["quant_cfg"], dict)  # ModelOpt before the list-shaped quant_cfg (e.g. 0.37)
    if weights.group_wise:
        if legacy:
            entries = [{"quantizer_name": "*weight_quantizer", "cfg": config["quant_cfg"]["*weight_quantizer"]}]
        else:
            entries = config["quant_cfg"]
        for entry in entries:
            if entry.get("quantizer_name") == "*weight_quantizer":
                cfgs = entry["cfg"] if isinstance(entry["cfg"], list) else [entry["cfg"]]
                cfgs[0]["block_sizes"][-1] = quant.group_size  # W4A8's list: [int4 blocks, fp8]
    kv = kv_cache_format(quant.kv_cache)
    if kv.quantized:  # ModelOpt quantizes the KV cache through the attention's k/v bmm quantizers
        kv_cfg = {"num_bits": kv.modelopt_num_bits, "axis": None}
        if legacy or not hasattr(mtq, "update_quant_cfg_with_kv_cache_quant"):
            # What TensorRT-LLM's quantize_by_modelopt did before ModelOpt had the helper: add the pattern.
            config["quant_cfg"] = {**(config["quant_cfg"] or {"default": {"enable": False}}), "*[kv]_bmm_quantizer": {**kv_cfg, "enable": True}}
            config["algorithm"] = config.get("algorithm") or "max"
        else:
            kv = [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": kv_cfg}]
            with contextlib.redirect_stdout(io.StringIO()):  # it prints the whole config
                config = mtq.update_quant_cfg_with_kv_cache_quant(config, kv)
    return config


def _load_model(hf_dir: Path, torch_dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the pipeline shows its own progress
    hint = "model.source must hold the weights as *.safetensors (pickle checkpoints are never loaded)"
    with _step("load", f"AutoModelForCausalLM.from_pretrained({hf_dir})", hint):
        model = AutoModelForCausalLM.from_pretrained(
            hf_dir, dtype=torch_dtype, low_cpu_mem_usage=True, use_safetensors=True, local_files_only=True
        )
    return model.eval()


@contextlib.contextmanager
def _step(step: str, what: str, hint: str = "re-run with --verbose for the ModelOpt traceback"):
    """Turn any failure into StageError naming the step; keep ModelOpt's prints out of the console."""
    printed = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(printed):
            for message in _BENIGN_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            yield
    except StageError:
        raise
    except Exception as exc:
        raise StageError(
            f"{step}: {what} failed: {type(exc).__name__}: {exc}".rstrip(": "), hint=hint
        ) from exc
    finally:
        if printed.getvalue().strip():
            log.debug("%s output:\n%s", step, printed.getvalue().rstrip())


def _finish_config(
    out_dir: Path, model_config: Any, hf: dict[str, Any], architecture: Architecture, quant: QuantRecipe
) -> dict[str, Any]:
    """Patch what ModelOpt 0.47 leaves out of config.json (as TRT-LLM's quantize.py does) and check it."""
    path = out_dir / "config.json"
    config = json.loads(path.read_text())
    config.update(rope_config_fields(model_config))
    if architecture.variant_key:  # e.g. qwen_type: TRT-LLM's QWenConfig defaults to qwen (v1)
        config[architecture.variant_key] = hf["model_type"]
    weights = weight_format(quant.algo)
    quantization = config.setdefault("quantization", {})
    if weights.modelopt_config is None:
        quantization["quant_algo"] = weights.trtllm_quant_algo  # none -> null, int8_wo -> W8A16
    expected = (weights.trtllm_quant_algo, kv_cache_format(quant.kv_cache).trtllm_kv_quant_algo)
    found = (quantization.get("quant_algo"), quantization.get("kv_cache_quant_algo"))
    if found != expected:
        raise StageError(f"export: config.json has quant_algo/kv_cache_quant_algo {found}, expected {expected}")
    if quantization.get("quant_algo") != "MIXED_PRECISION":
        (out_dir / "quant_cfg.json").unlink(missing_ok=True)  # TRT-LLM reads it only for MIXED_PRECISION
    world = int(config["mapping"]["world_size"])
    missing = [f"rank{r}.safetensors" for r in range(world) if not (out_dir / f"rank{r}.safetensors").is_file()]
    if missing:
        raise StageError(f"export: ModelOpt did not write {', '.join(missing)} (world_size {world})")
    path.write_text(json.dumps(config, indent=4) + "\n")
    return config
