"""quantize: calibrate with ModelOpt (when a format is chosen) and export the TensorRT-LLM checkpoint.

A published ModelOpt checkpoint that build.target serves as published (docs/prequantized.md) is a pass-through: the
job converts model.source's own codes and scales (no model load, no ModelOpt, no calibration) and the stage records
its hf_quant_config.json and scales (`published` in quantize.json).

The work is one quantize job (`pipeline.quantization.job`). It runs in this process on
quantize.device, except for the engine target with `quantize.device: cuda`, where it goes through the
build runner (local GPU, the pinned Triton TRT-LLM image, or a dry run that only writes the command).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.container_jobs import make_runner
from pipeline.quantization.dispatch import (
    CHECKPOINT_DIR,
    IN_PROCESS,
    SCRIPT_FILE,
    UNIFIED_HF_DIR,
    job_for,
    quantize_route,
    request_from_spec,
    run_quantize,
)
from pipeline.quantization.job import REQUEST_FILE, QuantizeRequest
from pipeline.stages.base import StageContext
from pipeline.stages.prepare import checkpoint_dir

__all__ = ["CHECKPOINT_DIR", "UNIFIED_HF_DIR", "quantize_checkpoint", "run"]


def run(ctx: StageContext) -> None:
    quantize_checkpoint(ctx, checkpoint_dir(ctx.upstream["prepare"].path))


def quantize_checkpoint(ctx: StageContext, hf_dir: Path) -> None:
    """Quantize the Hugging Face checkpoint `hf_dir` as ctx.spec says into ctx.out_dir/CHECKPOINT_DIR (the draft stage
    calls it with the draft's spec)."""
    spec = ctx.spec
    route = quantize_route(spec)
    # A dry run's files name the final artifact directory (run later on a GPU host); a real job names the one it ran in.
    artifact_dir = (ctx.final_dir or ctx.out_dir) if route == "dry-run" else ctx.out_dir
    request = request_from_spec(spec, hf_dir, artifact_dir, result_file=route != IN_PROCESS)
    result: dict[str, Any] | None
    if route == IN_PROCESS:
        from pipeline.quantization.job import run_job

        result = run_job(request, log=ctx.log)
    else:
        result = _run_through_runner(ctx, request, route, artifact_dir)
        if result is None:
            return
    if result["calibration"] is not None:
        ctx.notes["calibration"] = result["calibration"]
    if result.get("published") is not None:
        ctx.notes["published"] = result["published"]
        ctx.log(f"served as published, no calibration: {request.hf_dir} converted with its own scales")
    ctx.notes["quantization"] = summary = result["quantization"]
    (ctx.out_dir / "quantize.json").write_text(json.dumps(ctx.notes, indent=2, sort_keys=True) + "\n")
    ctx.log(f"wrote {', '.join(summary['ranks'])} (quant_algo {summary['quant_algo']}, kv {summary['kv_cache_quant_algo']})")


def _run_through_runner(ctx: StageContext, request: QuantizeRequest, kind: str, artifact_dir) -> dict[str, Any] | None:
    spec = ctx.spec
    job = job_for(spec, request, artifact_dir, ctx.out_dir)
    runner = make_runner(kind, image=None, gpus=spec.deploy.gpus, shm_size=spec.deploy.shm_size)
    if kind == "docker":
        ctx.log(f"quantize job on {request.device} in {job.version.image}")
    outcome = run_quantize(job, runner, log=ctx.log)
    ctx.notes.update(runner=kind, device=request.device, command=list(outcome.command), script=SCRIPT_FILE, request=REQUEST_FILE)
    if kind == "docker":
        ctx.notes["image"] = job.version.image
    if outcome.result is None:  # a dry run: run_quantize ran nothing
        _record_dry_run(ctx, request, job, outcome.docker_command)
        return None
    ctx.notes["job"] = {"device": outcome.result.get("device"), "versions": outcome.result.get("versions")}
    return outcome.result


def _record_dry_run(ctx: StageContext, request: QuantizeRequest, job, docker_command) -> None:
    """What the GPU host will run: the recipe, mapping and the job's command, without loading any weights."""
    spec = ctx.spec
    record = {
        "dry_run": True,
        "recipe": {"algo": request.algo, "kv_cache": request.kv_cache, "group_size": request.group_size},
        "prequantized": request.prequantized,
        "device": request.device,
        "dtype": request.dtype,
        "mapping": {"tp_size": request.tp_size, "pp_size": request.pp_size},
        "calibration": spec.quantize.calibration.model_dump(mode="json"),
        "command": list(job.argv),
        "script": SCRIPT_FILE,
        "request": REQUEST_FILE,
        "image": job.version.image,
        "docker_command": None if docker_command is None else list(docker_command),
        "call": "pipeline.quantization.job.run_job → modelopt_export.export_trtllm_checkpoint "
        "(ModelOpt mtq.quantize + export_hf_checkpoint, then trtllm_convert)",
    }
    (ctx.out_dir / "quantize.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    ctx.notes.update(dry_run=True, quantization={"quant_algo": request.algo, "kv_cache": request.kv_cache})
    ctx.log(
        f"dry run: wrote {SCRIPT_FILE} and {REQUEST_FILE} for the {request.algo} / KV {request.kv_cache} recipe on {request.device}; "
        "nothing is calibrated or exported"
    )
