"""What the quantize stage records of a published (pre-quantized) ModelOpt unified checkpoint it converts as it is.

The record is the checkpoint's own word (hf_quant_config.json's `quantization` block) and its scales as found: how
many tensors of each kind (`weight_scale`, `input_scale`, `weight_scale_2`, `pre_quant_scale`, `k_scale`,
`v_scale`), and the range of each kind's values, so that an artifact says which scales it was served with. Pure
safetensors + torch: ModelOpt is not imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors import safe_open

from pipeline.errors import StageError

HF_QUANT_CONFIG = "hf_quant_config.json"
SCALE_KINDS = ("weight_scale", "weight_scale_2", "input_scale", "pre_quant_scale", "k_scale", "v_scale")


def published_scales(hf_dir: Path) -> dict[str, Any]:
    """{"hf_quant_config": its quantization block, "scales": {kind: {"tensors", "min", "max"}}} of `hf_dir`."""
    hf_dir = Path(hf_dir)
    path = hf_dir / HF_QUANT_CONFIG
    try:
        declared = json.loads(path.read_text(encoding="utf-8")).get("quantization") or {}
    except (OSError, ValueError, AttributeError) as exc:
        raise StageError(f"pre-quantized checkpoint: cannot read {path} ({exc})") from None
    scales: dict[str, dict[str, Any]] = {}
    for file in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                kind = name.rsplit(".", 1)[-1]
                if kind not in SCALE_KINDS:
                    continue
                values = handle.get_tensor(name).float()
                entry = scales.setdefault(kind, {"tensors": 0, "min": float("inf"), "max": float("-inf")})
                entry["tensors"] += 1
                entry["min"] = min(entry["min"], float(values.min()))
                entry["max"] = max(entry["max"], float(values.max()))
    return {"hf_quant_config": declared, "scales": dict(sorted(scales.items()))}
