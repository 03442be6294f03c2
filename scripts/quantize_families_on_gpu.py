"""Run the quantize job on tiny random checkpoints of the model families, on the CPU and on CUDA, and compare.

    python3 scripts/quantize_families_on_gpu.py --out results.json [--families qwen3,gemma3_text] [--formats fp8,int4_awq]

For each family × format that the family table lets its target take (the engine target for TensorRT-LLM
families, llmapi's unified-only export for the others), the job (`pipeline.quantization.job.run_job`) runs
with quantize.device cpu and with cuda on the same checkpoint and calibration text, and the two TensorRT-LLM
checkpoints are compared tensor by tensor: ModelOpt calibrates on CUDA with other kernels, so scales may differ in
their last bits; a codes-and-scales difference beyond that is a finding. Needs torch with CUDA, transformers,
nvidia-modelopt and safetensors; this repository on sys.path (run it from the repository root). Used for the
H200 runs recorded in the model-families issue; no GPU here, so not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FORMATS = ("fp8", "int8_sq", "int4_awq", "w4a8_awq")
FAMILIES = ("llama", "qwen3", "qwen3_moe", "mixtral", "gemma2", "gemma3_text", "phi3", "granite", "starcoder2", "gpt_oss")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--devices", default="cpu,cuda")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for model_type in args.families.split(","):
            for algo in args.formats.split(","):
                rows.append(_one(Path(scratch), model_type, algo, args.devices.split(",")))
                print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(json.dumps({"versions": _versions(), "rows": rows}, indent=2) + "\n")
    return 0


def _one(scratch: Path, model_type: str, algo: str, devices: list[str]) -> dict:
    from pipeline.config.families import family_of
    from pipeline.config.targets import Target
    from tests.support.family_models import make_family_checkpoint

    family = family_of(model_type)
    target = Target.engine if family.trtllm_class is not None else Target.llmapi
    row = {"family": model_type, "algo": algo, "target": target.value}
    refusal = family.format_refusal(target, algo)
    if refusal is not None:
        return {**row, "status": "refused by the family table", "why": refusal}
    hf_dir = scratch / f"{model_type}-hf"
    if not hf_dir.is_dir():
        make_family_checkpoint(model_type, hf_dir)
    outputs = {}
    for device in devices:
        out = scratch / f"{model_type}-{algo}-{device}"
        started = time.monotonic()
        try:
            result = _run_job(hf_dir, out, algo, device, unified_only=family.trtllm_class is None)
        except Exception as exc:  # noqa: BLE001 - every failure is a row of the report
            return {**row, "status": f"failed on {device}", "error": f"{type(exc).__name__}: {exc}"[:600], "traceback": traceback.format_exc()[-1500:]}
        row[f"{device}_seconds"] = round(time.monotonic() - started, 1)
        row[f"{device}_result"] = result["quantization"]
        outputs[device] = out
    if {"cpu", "cuda"} <= set(outputs):
        row["cpu_vs_cuda"] = _compare(outputs["cpu"], outputs["cuda"], unified=family.trtllm_class is None)
    return {**row, "status": "ok"}


def _run_job(hf_dir: Path, out: Path, algo: str, device: str, *, unified_only: bool) -> dict:
    from pipeline.quantization.job import CalibrationRequest, QuantizeRequest, run_job

    files = tuple(sorted((REPO / "data" / "calibration").glob("*.txt")))
    request = QuantizeRequest(
        hf_dir=hf_dir,
        output_dir=out / "trtllm_checkpoint",
        dtype="bfloat16",
        tp_size=1,
        pp_size=1,
        algo=algo,
        kv_cache="fp8" if algo in ("fp8", "w4a8_awq") else "none",
        group_size=128,
        device=device,
        calibration=CalibrationRequest(files, 32, 128, 8, 0),
        unified_hf_dir=out / "hf_checkpoint" if unified_only else None,
        unified_only=unified_only,
    )
    return run_job(request)


def _compare(cpu_dir: Path, cuda_dir: Path, *, unified: bool) -> dict:
    import torch
    from safetensors.torch import load_file

    pattern = "hf_checkpoint/*.safetensors" if unified else "trtllm_checkpoint/rank*.safetensors"
    cpu = {k: v for f in sorted(cpu_dir.glob(pattern)) for k, v in load_file(f).items()}
    cuda = {k: v for f in sorted(cuda_dir.glob(pattern)) for k, v in load_file(f).items()}
    report = {
        "tensors": len(cpu),
        "same_names": sorted(cpu) == sorted(cuda),
        "bit_identical": 0,
        "largest_scale_ratio": 1.0,
        "largest_code_mismatch_fraction": 0.0,
    }
    for name in sorted(set(cpu) & set(cuda)):
        a, b = cpu[name], cuda[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            report.setdefault("shape_or_dtype_differs", []).append(name)
            continue
        if torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a, b.view(torch.uint8) if b.element_size() == 1 else b):
            report["bit_identical"] += 1
            continue
        if "scal" in name or a.numel() <= 8:
            ratio = (a.float().abs() + 1e-12) / (b.float().abs() + 1e-12)
            report["largest_scale_ratio"] = max(report["largest_scale_ratio"], float(torch.maximum(ratio, 1 / ratio).max()))
        else:
            mismatch = (
                float((a.view(torch.uint8) != b.view(torch.uint8)).float().mean())
                if a.element_size() == 1
                else float((a.float() - b.float()).abs().gt(1e-3 * (a.float().abs() + 1e-3)).float().mean())
            )
            report["largest_code_mismatch_fraction"] = max(report["largest_code_mismatch_fraction"], mismatch)
    return report


def _versions() -> dict:
    import torch

    from pipeline.quantization.job import package_versions

    return {**package_versions(), "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


if __name__ == "__main__":
    raise SystemExit(main())
