"""Hugging Face checkpoint -> (optional ModelOpt PTQ) -> unified HF checkpoint -> TensorRT-LLM checkpoint.

ModelOpt calibrates the model and `unified_export.export_unified_checkpoint` writes its unified Hugging Face
checkpoint (`export_hf_checkpoint`, what TensorRT-LLM's PyTorch backend loads); `trtllm_convert` turns that into
the TensorRT-LLM checkpoint (config.json + rank{N}.safetensors, N = tp_rank + pp_rank * tp_size) trtllm-build
reads. ModelOpt's own `export_tensorrt_llm_checkpoint` (deprecated in 0.48, removed in 0.49, as ModelOpt's
documentation announces) is no longer called. The checkpoint's config.json body is `trtllm_pretrained.pretrained_config` (the family's
keys), its quantization block what hf_quant_config.json says.

`device` is where the model is loaded and calibrated: `cpu`, or `cuda` (this host's GPU, or the GPU
of NVIDIA's TensorRT-LLM image when `pipeline.quantization.job` runs there). Those images ship an
older ModelOpt (TensorRT-LLM 1.1/1.2 pin `nvidia-modelopt~=0.37`), whose `quant_cfg` is a dict of
pattern -> quantizer config instead of 0.47's list of entries; `_mtq_config` writes either shape. Inside that
image only `pipeline/` is importable, so the job passes the checkpoint config it was given
(`checkpoint_config`); the family table (`pipeline.config.families`, which reads refengine's table) is
imported only when the caller did not.

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
from typing import TYPE_CHECKING, Any

import torch

from pipeline.errors import StageError
from pipeline.quant_formats import (
    KV_CACHE_FORMATS,
    WEIGHT_FORMATS,
    kv_cache_format,
    needs_calibration,
    recipe_quantization,
    weight_format,
)
from pipeline.quantization.trtllm_checkpoint.convert import HF_QUANT_CONFIG, convert_unified_checkpoint
from pipeline.quantization.trtllm_checkpoint.layout import LAYOUTS, layout_for
from pipeline.quantization.trtllm_checkpoint.reverse import trtllm_to_hf_state_dict
from pipeline.quantization.unified_export import export_unified_checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["QuantRecipe", "convert_published_checkpoint", "export_trtllm_checkpoint", "resolve_device", "trtllm_to_hf_state_dict"]

log = logging.getLogger(__name__)

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class QuantRecipe:
    algo: str  # a quantize.algo value (a key of quant_formats.WEIGHT_FORMATS: its ModelOpt config and quant_algo)
    kv_cache: str = "none"  # a quantize.kv_cache value (quant_formats.KV_CACHE_FORMATS)
    group_size: int = 128  # AWQ block size along the input dim


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "chat_template.jinja")
_BENIGN_WARNINGS = (
    "Enable lm_head quantization",  # printed although lm_head stays unquantized (exclude_modules lists it)
    "lm_head is not calibrated, skip smoothing",  # int8_sq: lm_head is excluded on purpose
)
# ModelOpt 0.47 warns at import that transformers >= 5.15 "is not tested with current version of modelopt"; this
# project's tests and exports run with the transformers it pins (5.24: exports bit-identical to 5.14's).
warnings.filterwarnings("ignore", message=r"transformers \S+ is not tested with current version of modelopt", category=UserWarning)
UNIFIED_SCRATCH_SUFFIX = ".unified-hf"  # <out_dir><suffix>: the unified export converted, then removed


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
    checkpoint_config: dict[str, Any] | None = None,
    unified_only: bool = False,
) -> dict[str, Any]:
    """Export `hf_dir` as a TensorRT-LLM checkpoint into `out_dir`; return the written config.json.

    The calibrated model is exported as ModelOpt's unified Hugging Face checkpoint into `unified_hf_dir` (kept,
    with the tokenizer: the llmapi target's checkpoint) or into a scratch directory beside `out_dir` (removed),
    and converted from there. `checkpoint_config` is the TensorRT-LLM config.json body (default:
    `pretrained_config` of the family); its `quantization` must agree with the recipe. With `unified_only`
    (families outside TensorRT-LLM's MODEL_MAP, llmapi target) only `unified_hf_dir` is written and the result is
    `{"quantization": <hf_quant_config.json's quant_algo and kv_cache_quant_algo>}`.

    `dtype` (float16 | bfloat16) is the dtype of the model while loading/calibrating and of the
    unquantized tensors in the checkpoint. `forward_loop(model)` runs the calibration batches; it is
    needed whenever `quant` asks for ModelOpt PTQ (every algo except none / int8_wo without KV quant);
    it receives the model on `device` and must put its batches there.
    """
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    quant = quant or QuantRecipe("none")
    hf_config = _read_hf_config(hf_dir)
    if unified_only and unified_hf_dir is None:
        raise StageError("export: unified_only needs unified_hf_dir (the unified checkpoint is all it writes)")
    _check_request(hf_config, out_dir, dtype=dtype, tp_size=tp_size, pp_size=pp_size, quant=quant, convert=not unified_only)
    convert_config: dict[str, Any] | None = None  # None: unified_only, nothing is converted
    if not unified_only:
        convert_config = checkpoint_config
        if convert_config is None:
            convert_config = _family_checkpoint_config(hf_config, dtype=dtype, tp_size=tp_size, pp_size=pp_size, quant=quant)
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
            # transformers types PreTrainedModel.to by functools.wraps(Module.to), which keeps Module.to's self argument
            model = model.to(torch_device)  # type: ignore[arg-type]
    if mtq_config is not None:
        import modelopt.torch.quantization as mtq

        with _step("quantize", f"mtq.quantize ({quant.algo}, kv_cache {quant.kv_cache})"):
            model = mtq.quantize(model, mtq_config, forward_loop)

    unified_dir = Path(unified_hf_dir) if unified_hf_dir is not None else out_dir.with_name(out_dir.name + UNIFIED_SCRATCH_SUFFIX)
    if unified_hf_dir is None:
        shutil.rmtree(unified_dir, ignore_errors=True)  # a scratch copy left by a killed run
    try:
        with _step("export", "export_hf_checkpoint (unified Hugging Face checkpoint)"), torch.no_grad():
            export_unified_checkpoint(model, unified_dir, dtype=TORCH_DTYPES[dtype])
        del model
        if unified_hf_dir is not None:
            for name in _TOKENIZER_FILES:  # the unified export does not copy the tokenizer
                if (hf_dir / name).is_file():
                    shutil.copy2(hf_dir / name, unified_dir / name)
        if convert_config is None:
            return {"quantization": _unified_quantization(unified_dir, quant)}
        config = convert_unified_checkpoint(unified_dir, out_dir, config=convert_config, tp_size=tp_size, pp_size=pp_size)
    finally:
        if unified_hf_dir is None:
            shutil.rmtree(unified_dir, ignore_errors=True)
    return _finish_config(out_dir, config, quant)


def convert_published_checkpoint(
    hf_dir: Path, out_dir: Path, *, dtype: str, tp_size: int, pp_size: int, quant: QuantRecipe, checkpoint_config: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A published ModelOpt unified checkpoint (`nvidia/...-FP8`: what `export_unified_checkpoint` writes after
    calibration) converted into `out_dir` as it is: no model load, no ModelOpt, its own codes and scales. `quant` names
    the format it holds; hf_quant_config.json must say the same (the converter refuses otherwise, naming the file)."""
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    hf_config = _read_hf_config(hf_dir)
    _check_request(hf_config, out_dir, dtype=dtype, tp_size=tp_size, pp_size=pp_size, quant=quant)
    if checkpoint_config is None:
        checkpoint_config = _family_checkpoint_config(hf_config, dtype=dtype, tp_size=tp_size, pp_size=pp_size, quant=quant)
    config = convert_unified_checkpoint(hf_dir, out_dir, config=checkpoint_config, tp_size=tp_size, pp_size=pp_size)
    return _finish_config(out_dir, config, quant)


def _family_checkpoint_config(hf: dict[str, Any], *, dtype: str, tp_size: int, pp_size: int, quant: QuantRecipe) -> dict[str, Any]:
    """The family's config.json body, read from the family table (this process only: a job in NVIDIA's image is
    given `checkpoint_config`, and quantize_dispatch.checkpoint_request has refused there what the table refuses).
    A format the table refuses for the family on trtllm-build (the consumer of this checkpoint) is refused here,
    before any weights load."""
    from pipeline.config.families import family_of
    from pipeline.config.targets import Target
    from pipeline.quantization.trtllm_checkpoint.pretrained import checkpoint_mapping, pretrained_config

    family = family_of(str(hf.get("model_type")))
    if family is None or family.trtllm_class is None:
        where = (
            "it is not in the family table"
            if family is None
            else ("it is not in TensorRT-LLM 1.2's MODEL_MAP; build.target llmapi takes its unified checkpoint")
        )
        raise StageError(f"model_type {hf.get('model_type')!r} has no TensorRT-LLM checkpoint: {where}")
    why = family.format_refusal(Target.engine, quant.algo)
    if why:
        raise StageError(
            f"export: {family.name} in quantize.algo {quant.algo} is refused for the TensorRT-LLM checkpoint (trtllm-build): {why}",
            hint="pick a format the family table takes (docs/targets.md: Model families)",
        )
    return pretrained_config(hf, dtype=dtype, mapping=checkpoint_mapping(tp_size, pp_size), quantization=recipe_quantization(quant.algo, quant.kv_cache))


def _unified_quantization(unified_dir: Path, quant: QuantRecipe) -> dict[str, Any]:
    """hf_quant_config.json's algorithms (none when the export wrote none: an unquantized model), checked."""
    path = unified_dir / HF_QUANT_CONFIG
    found = json.loads(path.read_text()).get("quantization", {}) if path.is_file() else {}
    block = {"quant_algo": found.get("quant_algo"), "kv_cache_quant_algo": found.get("kv_cache_quant_algo")}
    expected = recipe_quantization(quant.algo, quant.kv_cache, unified=True)
    if block != expected:
        raise StageError(f"export: {path} says {block}, the recipe {quant.algo}/{quant.kv_cache} expects {expected}")
    return block


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


def _read_hf_config(hf_dir: Path) -> dict[str, Any]:
    path = hf_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        hint = "model.path must be a local HF checkpoint directory"
        raise StageError(f"load: cannot read {path}: {exc}", hint=hint) from exc
    if not isinstance(config, dict):
        raise StageError(f"load: {path} is not a JSON object")
    return config


def _check_request(hf: dict[str, Any], out_dir: Path, *, dtype: str, tp_size: int, pp_size: int, quant: QuantRecipe, convert: bool = True) -> None:
    """Reject, before any weights load, what the export or the conversion would reject later or do wrongly."""
    if convert:
        _check_convertible(hf)
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


def _check_convertible(hf: dict[str, Any]) -> None:
    model_type = hf.get("model_type")
    try:
        layout_for(str(model_type))
    except StageError as exc:
        arch = " (" + ", ".join(hf["architectures"]) + ")" if hf.get("architectures") else ""
        supported = ", ".join(t for layout in LAYOUTS for t in layout.model_types)
        raise StageError(
            f"model_type {model_type!r}{arch} is not supported by the TensorRT-LLM checkpoint export ({exc.message}); supported: {supported}",
            hint="the llmapi target loads the unified Hugging Face checkpoint of more families (pipeline.config.families)",
        ) from None


def _needs_ptq(quant: QuantRecipe) -> bool:
    return needs_calibration(weight_format(quant.algo), kv_cache_format(quant.kv_cache))


def _mtq_config(quant: QuantRecipe) -> dict[str, Any]:
    """The ModelOpt 0.47 config for `quant` (a deep copy; 0.47's `quant_cfg` is a list of entries)."""
    import modelopt.torch.quantization as mtq

    weights = weight_format(quant.algo)
    config: dict[str, Any] = copy.deepcopy(getattr(mtq, weights.modelopt_config)) if weights.modelopt_config else {"quant_cfg": None}
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
            kv_entries = [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": kv_cfg}]
            with contextlib.redirect_stdout(io.StringIO()):  # it prints the whole config
                config = mtq.update_quant_cfg_with_kv_cache_quant(config, kv_entries)
    return config


def _load_model(hf_dir: Path, torch_dtype: torch.dtype) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the pipeline shows its own progress
    hint = "model.source must hold the weights as *.safetensors (pickle checkpoints are never loaded)"
    with _step("load", f"AutoModelForCausalLM.from_pretrained({hf_dir})", hint):
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch_dtype, low_cpu_mem_usage=True, use_safetensors=True, local_files_only=True)
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
        raise StageError(f"{step}: {what} failed: {type(exc).__name__}: {exc}".rstrip(": "), hint=hint) from exc
    finally:
        if printed.getvalue().strip():
            log.debug("%s output:\n%s", step, printed.getvalue().rstrip())


def _finish_config(out_dir: Path, config: dict[str, Any], quant: QuantRecipe) -> dict[str, Any]:
    """Check the converted checkpoint: the recipe's quant_algo/kv_cache_quant_algo and one rank file per rank."""
    weights = weight_format(quant.algo)
    expected = (weights.trtllm_quant_algo, kv_cache_format(quant.kv_cache).trtllm_kv_quant_algo)
    quantization = config.get("quantization") or {}
    found = (quantization.get("quant_algo"), quantization.get("kv_cache_quant_algo"))
    if found != expected:
        raise StageError(f"export: {out_dir / 'config.json'} has quant_algo/kv_cache_quant_algo {found}, expected {expected}")
    world = int(config["mapping"]["world_size"])
    missing = [f"rank{r}.safetensors" for r in range(world) if not (out_dir / f"rank{r}.safetensors").is_file()]
    if missing:
        raise StageError(f"export: the conversion did not write {', '.join(missing)} (world_size {world})")
    return config
