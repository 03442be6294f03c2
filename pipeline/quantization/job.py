"""The quantize job: one request file in, one TensorRT-LLM checkpoint out.

    python3 -m pipeline.quantization.job --request quantize_request.json [--device cpu|cuda]

The request carries every value the job needs (paths, dtype, mapping, recipe, device and the expanded
calibration files), so the job never loads the build config. The quantize stage calls `run_job` in its
own process (quantize.device cpu, or cuda with `build.runner local`); `build.runner docker` runs this
module inside the pinned `nvcr.io/nvidia/tritonserver:<tag>-trtllm-python-py3` image with the
project's `pipeline/` package mounted read-only on PYTHONPATH (pipeline.quantization.dispatch).
Either way the same `run_job` → `modelopt_export.export_trtllm_checkpoint` writes the checkpoint.

What the job assumes about the image (the tensorrt_llm wheel installed there pulls all of it in):
  * Python >= 3.10, and `python3` on PATH;
  * torch built with CUDA, and a GPU given to the container (`docker run --gpus`);
  * transformers >= 4.56 (`from_pretrained(dtype=...)`; TensorRT-LLM 1.2 pins 4.57.1) and tokenizers;
  * nvidia-modelopt with `export_hf_checkpoint` (TensorRT-LLM 1.1/1.2 pin ~=0.37; `modelopt_export` writes its
    dict-shaped quant configs as well as 0.47's lists); the TensorRT-LLM checkpoint is converted from the
    unified checkpoint by this project (pipeline.quantization.trtllm_checkpoint.convert), not by ModelOpt;
  * safetensors.
Nothing else outside the standard library is imported: not pydantic, PyYAML or rich. Of this project only
pipeline.errors, pipeline.quant_formats, pipeline.calibration and pipeline.quantization's modelopt_export,
unified_export, published and trtllm_checkpoint are imported (tests/pipeline/quantization/test_quantize_job.py
checks the list): not pipeline.config, so the request carries the checkpoint config (`checkpoint_config`, from
the family table) and whether only the unified checkpoint is written (`unified_only`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import PipelineError, StageError

if TYPE_CHECKING:
    from pipeline.calibration import CalibrationSet

JOB_MODULE = "pipeline.quantization.job"
REQUEST_FILE = "quantize_request.json"
RESULT_FILE = "quantize_result.json"
REQUEST_FORMAT = "trtllm-pipeline quantize request 1"
HF_QUANT_CONFIG = "hf_quant_config.json"  # ModelOpt's quantization record in a unified checkpoint
DEVICES = ("cpu", "cuda")
_VERSIONED = {"torch": "torch", "transformers": "transformers", "modelopt": "nvidia-modelopt", "safetensors": "safetensors"}

Log = Callable[[str], None]


@dataclass(frozen=True)
class CalibrationRequest:
    files: tuple[Path, ...]  # expanded, absolute
    num_samples: int
    max_seq_len: int
    batch_size: int
    seed: int


@dataclass(frozen=True)
class QuantizeRequest:
    hf_dir: Path  # the prepared Hugging Face checkpoint (weights + tokenizer)
    output_dir: Path  # the TensorRT-LLM checkpoint to write
    dtype: str  # float16 | bfloat16
    tp_size: int
    pp_size: int
    algo: str  # a quantize.algo value (pipeline.quant_formats.WEIGHT_FORMATS)
    kv_cache: str  # none | fp8 | int8
    group_size: int
    device: str  # cpu | cuda
    calibration: CalibrationRequest | None  # None: the recipe needs no calibration
    unified_hf_dir: Path | None = None  # keep ModelOpt's unified HF checkpoint there (llmapi target)
    result_file: Path | None = None  # where the job writes what it did (quantize_result.json)
    # the TensorRT-LLM config.json body (trtllm_pretrained.pretrained_config); None: the job derives it itself
    # (in this project's environment only: the family table is not importable in NVIDIA's image)
    checkpoint_config: dict[str, Any] | None = None
    unified_only: bool = False  # write only unified_hf_dir (a family outside TensorRT-LLM's MODEL_MAP), no output_dir
    # hf_dir is a published ModelOpt unified checkpoint in the format algo / kv_cache name: it is converted as it is
    # (no model load, no ModelOpt, no calibration)
    prequantized: bool = False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("hf_dir", "output_dir", "unified_hf_dir", "result_file"):
            data[key] = None if data[key] is None else str(data[key])
        if self.calibration is not None:
            data["calibration"]["files"] = [str(f) for f in self.calibration.files]
        return {"format": REQUEST_FORMAT, **data}

    @classmethod
    def from_json(cls, data: Any, *, source: str = "quantize request") -> QuantizeRequest:
        """Parse and check a request; every problem is a StageError naming the field."""
        if not isinstance(data, dict):
            raise StageError(f"{source}: expected a JSON object")
        if data.get("format") != REQUEST_FORMAT:
            raise StageError(f"{source}: format is {data.get('format')!r}, expected {REQUEST_FORMAT!r} (written by another version?)")
        names = {f.name for f in fields(cls)}
        unknown, missing = (
            set(data) - names - {"format"},
            {"hf_dir", "output_dir", "dtype", "tp_size", "pp_size", "algo", "kv_cache", "group_size", "device", "calibration"} - set(data),
        )
        if unknown or missing:
            raise StageError(f"{source}: unknown fields {sorted(unknown)}, missing fields {sorted(missing)}")
        values = {key: data[key] for key in names if key in data}
        for key in ("hf_dir", "output_dir", "unified_hf_dir", "result_file"):
            values[key] = _path(values.get(key), f"{source}: {key}", optional=key in ("unified_hf_dir", "result_file"))
        for key in ("dtype", "algo", "kv_cache", "device"):
            _expect(values[key], str, f"{source}: {key}")
        for key in ("tp_size", "pp_size", "group_size"):
            _expect(values[key], int, f"{source}: {key}")
        if values["device"] not in DEVICES:
            raise StageError(f"{source}: device {values['device']!r} is not one of {', '.join(DEVICES)}")
        values["calibration"] = _calibration(values["calibration"], f"{source}: calibration")
        if values.get("checkpoint_config") is not None:
            _expect(values["checkpoint_config"], dict, f"{source}: checkpoint_config")
        _expect(values.setdefault("unified_only", False), bool, f"{source}: unified_only")
        if values["unified_only"] and values.get("unified_hf_dir") is None:
            raise StageError(f"{source}: unified_only is true but unified_hf_dir is not set")
        _expect(values.setdefault("prequantized", False), bool, f"{source}: prequantized")
        if values["prequantized"] and (values["calibration"] is not None or values["unified_only"]):
            raise StageError(f"{source}: prequantized is true, so calibration must be null and unified_only false (it is converted as published)")
        return cls(**values)

    def write(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> QuantizeRequest:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise StageError(f"cannot read the quantize request {path} ({exc})") from None
        return cls.from_json(data, source=str(path))


def _expect(value: Any, kind: type, what: str) -> None:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise StageError(f"{what}: expected {kind.__name__}, got {value!r}")


def _path(value: Any, what: str, *, optional: bool) -> Path | None:
    if value is None and optional:
        return None
    return _absolute_path(value, what)


def _absolute_path(value: Any, what: str) -> Path:
    _expect(value, str, what)
    if not Path(value).is_absolute():
        raise StageError(f"{what}: expected an absolute path, got {value!r}")
    return Path(value)


def _calibration(value: Any, what: str) -> CalibrationRequest | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {f.name for f in fields(CalibrationRequest)}:
        raise StageError(f"{what}: expected an object with {', '.join(f.name for f in fields(CalibrationRequest))}")
    if not isinstance(value["files"], list) or not value["files"]:
        raise StageError(f"{what}: files must be a non-empty list")
    files = tuple(_absolute_path(f, f"{what}: files") for f in value["files"])
    for key in ("num_samples", "max_seq_len", "batch_size", "seed"):
        _expect(value[key], int, f"{what}: {key}")
    return CalibrationRequest(files, value["num_samples"], value["max_seq_len"], value["batch_size"], value["seed"])


# -- the job ------------------------------------------------------------------------------------------
def run_job(request: QuantizeRequest, *, log: Log | None = None) -> dict[str, Any]:
    """Calibrate (when the request has calibration), export the checkpoint, and return (and write) the result."""
    from pipeline.quantization.modelopt_export import (
        QuantRecipe,
        export_trtllm_checkpoint,
        resolve_device,
    )

    log = log or (lambda message: None)
    if request.prequantized:
        return _convert_published(request, log)
    device = resolve_device(request.device)  # refuse cuda without a CUDA device before any work
    forward_loop, calibration_summary = None, None
    if request.calibration is not None:
        calibration = _calibration_set(request.calibration, request.hf_dir)
        forward_loop = make_forward_loop(calibration.batches(request.calibration.batch_size))
        calibration_summary = calibration.summary()
        log(
            f"calibration: {len(calibration.windows)} × {request.calibration.max_seq_len} tokens from "
            f"{len(calibration.files)} file(s), token-id fingerprint {calibration.fingerprint[:16]}"
        )
    recipe = QuantRecipe(request.algo, request.kv_cache, request.group_size)
    what = "unquantized" if recipe.algo == "none" and recipe.kv_cache == "none" else f"{recipe.algo} weights, {recipe.kv_cache} KV cache"
    target = (
        f"unified Hugging Face checkpoint only ({request.unified_hf_dir})"
        if request.unified_only
        else f"TensorRT-LLM checkpoint (tp={request.tp_size}, pp={request.pp_size})"
    )
    log(f"{what} → {request.dtype} {target} with ModelOpt on {device}")
    config = export_trtllm_checkpoint(
        request.hf_dir,
        request.output_dir,
        dtype=request.dtype,
        tp_size=request.tp_size,
        pp_size=request.pp_size,
        quant=recipe,
        forward_loop=forward_loop,
        unified_hf_dir=request.unified_hf_dir,
        device=str(device),
        checkpoint_config=request.checkpoint_config,
        unified_only=request.unified_only,
    )
    return _result(request, config, calibration_summary, _device_description(device))


def _convert_published(request: QuantizeRequest, log: Log) -> dict[str, Any]:
    """A published ModelOpt unified checkpoint converted as it is: its own weights and scales, no calibration."""
    from pipeline.quantization.modelopt_export import QuantRecipe, convert_published_checkpoint
    from pipeline.quantization.published import published_scales

    log(
        f"{request.hf_dir}: pre-quantized ({request.algo} weights, {request.kv_cache} KV cache) → {request.dtype} TensorRT-LLM "
        f"checkpoint (tp={request.tp_size}, pp={request.pp_size}), served as published: no model load, no calibration"
    )
    config = convert_published_checkpoint(
        request.hf_dir,
        request.output_dir,
        dtype=request.dtype,
        tp_size=request.tp_size,
        pp_size=request.pp_size,
        quant=QuantRecipe(request.algo, request.kv_cache, request.group_size),
        checkpoint_config=request.checkpoint_config,
    )
    return _result(request, config, None, "not loaded (converted as published)", published=published_scales(request.hf_dir))


def _result(request: QuantizeRequest, config: dict[str, Any], calibration: Any, device: str, **extra: Any) -> dict[str, Any]:
    quantization = config.get("quantization", {})
    result = {
        "quantization": {
            "quant_algo": quantization.get("quant_algo"),
            "kv_cache_quant_algo": quantization.get("kv_cache_quant_algo"),
            "ranks": sorted(p.name for p in Path(request.output_dir).glob("rank*.safetensors")),
        },
        "calibration": calibration,
        "device": device,
        "versions": package_versions(),
        **extra,
    }
    if request.result_file is not None:
        Path(request.result_file).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return result


def _calibration_set(spec: CalibrationRequest, hf_dir: Path) -> CalibrationSet:
    from pipeline.calibration import calibration_windows, load_encoder

    missing = [str(f) for f in spec.files if not f.is_file()]
    if missing:
        raise StageError(f"calibration files not found: {', '.join(missing)}", hint="mount or copy them at the same paths")
    encode, eos_id = load_encoder(hf_dir)
    return calibration_windows(spec.files, encode, eos_id, max_seq_len=spec.max_seq_len, num_samples=spec.num_samples, seed=spec.seed)


def make_forward_loop(batches: list[list[list[int]]]):
    """ModelOpt's forward_loop: the calibration batches, each moved to the device the model is on."""
    import torch

    tensors = [torch.tensor(batch, dtype=torch.long) for batch in batches]

    def forward_loop(model) -> None:
        device = next(model.parameters()).device
        with torch.no_grad():
            for batch in tensors:
                model(batch.to(device))

    return forward_loop


def _device_description(device) -> str:
    if device.type != "cuda":
        return str(device)
    import torch

    return f"{device} ({torch.cuda.get_device_name(device)})"


def package_versions() -> dict[str, str]:
    versions = {}
    for short, dist in _VERSIONED.items():
        try:
            versions[short] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[short] = "absent"
    return versions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python3 -m {JOB_MODULE}",
        description="Calibrate with ModelOpt and export the TensorRT-LLM checkpoint a trtllm-pipeline quantize request describes.",
    )
    parser.add_argument("--request", type=Path, required=True, help=f"the request JSON ({REQUEST_FILE})")
    parser.add_argument("--device", choices=DEVICES, help="run on this device instead of the request's")
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        print(f"quantize job: {message}", file=sys.stderr, flush=True)

    try:
        request = QuantizeRequest.read(args.request)
        if args.device is not None and args.device != request.device:
            log(f"device {args.device} instead of the request's {request.device}")
            request = replace(request, device=args.device)
        result = run_job(request, log=log)
    except PipelineError as exc:
        print(f"quantize job failed: {exc.message}\n  hint: {exc.hint}", file=sys.stderr)
        return 1
    q = result["quantization"]
    wrote = f"the unified checkpoint to {request.unified_hf_dir}" if request.unified_only else f"{', '.join(q['ranks'])} to {request.output_dir}"
    log(f"wrote {wrote} (quant_algo {q['quant_algo']}, kv {q['kv_cache_quant_algo']})")
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
