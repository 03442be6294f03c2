"""Quantized TensorRT-LLM checkpoints of one tiny random Llama, with ModelOpt's fake-quant models.

`build_quantized_suite`, behind the session-scoped `quantized_suite` fixture of conftest.py (built
once per session, only when a test asks for it), saves a seeded random Llama (hidden 256,
intermediate 768, 4 layers, 4 heads / 2 KV heads, vocab 512) as fp16 safetensors, then exports
every format once through the pipeline's `export_trtllm_checkpoint` with one deterministic
calibration set (8 batches × [4, 64] random tokens; the AWQ formats, whose
scale search runs per batch and took 50 s each, see its first 2). ModelOpt's unified export changes the model
in place (`requantize_resmooth_fused_llm_layers` averages AWQ/SmoothQuant pre-quant scales over q/k/v and gate/up
and re-quantizes, shares their FP8 amax), so the fake-quant model is deep-copied just before
`export_hf_checkpoint` runs; a copy after ModelOpt's own pre-export step is kept too.

int8_wo is exported unquantized (quant_algo W8A16; the engine quantizes at load), so its
reference is ModelOpt's INT8_WEIGHT_ONLY_CFG fake-quant (per-channel int8) of the same weights.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from refengine.checkpoint import load_checkpoint
from refengine.model_runner import LlamaModel, ModelRunner, build_attention_metadata

VOCAB_SIZE = 512
TOKENS_PER_BLOCK = 8
PREFILL_SHAPE = (2, 48)
AWQ_CALIBRATION_BATCHES = 2

# name -> (QuantRecipe algo, kv_cache)
FORMATS: dict[str, tuple[str, str]] = {
    "fp8": ("fp8", "none"),
    "fp8_kv_fp8": ("fp8", "fp8"),
    "int8_sq": ("int8_sq", "none"),
    "int8_sq_kv_int8": ("int8_sq", "int8"),
    "int8_wo": ("int8_wo", "none"),
    "int4_awq": ("int4_awq", "none"),
    "w4a8_awq": ("w4a8_awq", "none"),
}


@dataclass
class QuantizedExport:
    name: str
    checkpoint_dir: Path
    config: dict[str, Any]
    fake_quant: Any  # ModelOpt's fake-quant model before export, float32
    fake_quant_exported: Any | None  # the same model as the export left it, float32 (None: int8_wo)
    seconds: float


@dataclass
class QuantizedSuite:
    hf_dir: Path
    unquantized: Any  # the fp16 weights in a float32 transformers model
    exports: dict[str, QuantizedExport]
    nvfp4_dir: Path | None  # an NVFP4 export (calibrates on CPU), or None if ModelOpt refused
    seconds: dict[str, float] = field(default_factory=dict)


def _tiny_llama(directory: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        architectures=["LlamaForCausalLM"],
    )
    LlamaForCausalLM(config).to(torch.float16).save_pretrained(directory)


def _load_float32(hf_dir: Path) -> Any:
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


@contextlib.contextmanager
def _capture_models(captured: dict[str, Any]):
    """Wrap the unified export: keep a copy of the calibrated model before it, and a copy after ModelOpt's own
    pre-export step (`requantize_resmooth_fused_llm_layers`: averaged AWQ/SmoothQuant pre-quant scales, folded into
    the norms). The export itself then packs the weights in place, which leaves no runnable model.

    "before" is copied as `export_unified_checkpoint` receives the model: inside it, `export_hf_checkpoint` sees
    INT8 K/V quantizers disabled with their amax reset (unified_export writes those scales itself), so a copy taken
    there would run without the INT8 KV cache; "after" is made from that copy for the same reason."""
    import modelopt.torch.export as modelopt_export
    from modelopt.torch.export.unified_export_hf import requantize_resmooth_fused_llm_layers

    import pipeline.quantization.modelopt_export as pipeline_export

    original_hf, original_unified = modelopt_export.export_hf_checkpoint, pipeline_export.export_unified_checkpoint

    def unified(model, *args, **kwargs):
        captured["before"] = copy.deepcopy(model)
        return original_unified(model, *args, **kwargs)

    def export(model, *args, **kwargs):
        captured["after"] = copy.deepcopy(captured["before"])
        with torch.no_grad():
            requantize_resmooth_fused_llm_layers(captured["after"])
        return original_hf(model, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(modelopt_export, "export_hf_checkpoint", export)
        patch.setattr(pipeline_export, "export_unified_checkpoint", unified)
        yield


def _float32(model: Any) -> Any:
    return None if model is None else model.float().eval()


def _build_suite(root: Path) -> QuantizedSuite:
    import modelopt.torch.quantization as mtq

    from pipeline.quantization.modelopt_export import QuantRecipe, export_trtllm_checkpoint

    hf_dir = root / "hf"
    _tiny_llama(hf_dir)
    generator = torch.Generator().manual_seed(1)
    calibration = [torch.randint(0, VOCAB_SIZE, (4, 64), generator=generator) for _ in range(8)]

    def forward_loop(model: Any) -> None:
        for batch in calibration:
            model(batch)

    def short_forward_loop(model: Any) -> None:  # AWQ searches its scales per batch: 2 batches, not 8
        for batch in calibration[:AWQ_CALIBRATION_BATCHES]:
            model(batch)

    suite = QuantizedSuite(hf_dir, _load_float32(hf_dir), {}, None)
    for name, (algo, kv_cache) in FORMATS.items():
        start, captured = time.perf_counter(), {}
        with _capture_models(captured):
            config = export_trtllm_checkpoint(
                hf_dir,
                root / name,
                dtype="float16",
                tp_size=1,
                pp_size=1,
                quant=QuantRecipe(algo, kv_cache),
                forward_loop=short_forward_loop if "awq" in algo else forward_loop,
            )
        if algo == "int8_wo":  # no PTQ in the export: fake-quantize the same weights per channel
            model = _load_float32(hf_dir)
            captured["before"] = mtq.quantize(model, copy.deepcopy(mtq.INT8_WEIGHT_ONLY_CFG), forward_loop)
            captured.pop("after", None)  # no quantizers: the model was saved as it is
        suite.exports[name] = QuantizedExport(
            name,
            root / name,
            config,
            _float32(captured["before"]),
            _float32(captured.get("after")),
            time.perf_counter() - start,
        )
    start = time.perf_counter()
    with contextlib.suppress(Exception):  # NVFP4 needs CUDA for a forward; max calibration may pass
        export_trtllm_checkpoint(
            hf_dir,
            root / "nvfp4",
            dtype="float16",
            tp_size=1,
            pp_size=1,
            quant=QuantRecipe("nvfp4"),
            forward_loop=forward_loop,
        )
        suite.nvfp4_dir = root / "nvfp4"
    suite.seconds["nvfp4"] = time.perf_counter() - start
    return suite


def build_quantized_suite(tmp_path_factory: pytest.TempPathFactory) -> QuantizedSuite:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # shared 2-core machines: a second thread mostly waits (AWQ: 10x slower)
    try:
        start = time.perf_counter()
        suite = _build_suite(tmp_path_factory.mktemp("quantized"))
        suite.seconds["total"] = time.perf_counter() - start
        return suite
    finally:
        torch.set_num_threads(previous)


# -- helpers -----------------------------------------------------------------------------------
def prefill_tokens() -> torch.Tensor:
    """The fixed [2, 48] batch every format is compared on (not the calibration data)."""
    return torch.randint(0, VOCAB_SIZE, PREFILL_SHAPE, generator=torch.Generator().manual_seed(2))


def paged_prefill(model: LlamaModel, sequences: list[list[int]]) -> tuple[list[torch.Tensor], ModelRunner]:
    """Logits [len, vocab] of each sequence after one paged prefill, and the runner (KV tensors)."""
    blocks = [-(-len(sequence) // TOKENS_PER_BLOCK) for sequence in sequences]
    runner = ModelRunner(model, num_blocks=sum(blocks), tokens_per_block=TOKENS_PER_BLOCK)
    tables, next_block = [], 0
    for count in blocks:
        tables.append(list(range(next_block, next_block + count)))
        next_block += count
    metadata = build_attention_metadata([len(s) for s in sequences], [0] * len(sequences), tables, TOKENS_PER_BLOCK)
    input_ids = torch.tensor([t for sequence in sequences for t in sequence], dtype=torch.int64)
    with torch.inference_mode():
        logits = model.compute_logits(model.forward(input_ids, runner.kv_caches, metadata))
    return list(logits.split([len(s) for s in sequences])), runner


def engine_logits(checkpoint_dir: Path, tokens: torch.Tensor) -> torch.Tensor:
    model = LlamaModel.from_checkpoint(load_checkpoint(checkpoint_dir))
    logits, _ = paged_prefill(model, tokens.tolist())
    return torch.stack(logits)


def hf_logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens).logits.float()


def min_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Minimum over sequences of the cosine of the flattened logits (the measure ModelOpt's fake-quant comparisons use here)."""
    return min(torch.nn.functional.cosine_similarity(x.flatten().double(), y.flatten().double(), dim=0).item() for x, y in zip(a, b))


def read_config(checkpoint_dir: Path) -> dict[str, Any]:
    return json.loads((checkpoint_dir / "config.json").read_text())


# -- hand-made quantized checkpoints (no ModelOpt) ----------------------------------------------
LINEAR_NAMES = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")


def quantize_linears(tensors: dict[str, torch.Tensor], algo: str, group_size: int = 16) -> None:
    """Rewrite every decoder Linear of a float checkpoint in place as ModelOpt would export `algo`.

    Plain max calibration of the weights; activation scales assume |x| <= 8 (FP8) / 4 (INT8).
    """
    from refengine.model_runner.quant_ops import pack_int4

    weight_names = [n for n in tensors if any(n.endswith(f".{linear}.weight") for linear in LINEAR_NAMES)]
    for name in weight_names:
        prefix, weight = name.removesuffix(".weight"), tensors[name].to(torch.float32)
        out_f, in_f = weight.shape
        if algo == "FP8":
            scale = weight.abs().max() / 448.0
            tensors[name] = (weight / scale).to(torch.float8_e4m3fn)
            tensors[f"{prefix}.weights_scaling_factor"] = scale.reshape(1)
            tensors[f"{prefix}.activation_scaling_factor"] = torch.tensor([8.0 / 448.0])
        elif algo == "W8A8_SQ_PER_CHANNEL":
            scale = weight.abs().amax(dim=1) / 127.0
            tensors[name] = torch.round(weight / scale[:, None]).clamp(-128, 127).to(torch.int8)
            tensors[f"{prefix}.weights_scaling_factor"] = scale
            tensors[f"{prefix}.activation_scaling_factor"] = torch.tensor([4.0 / 127.0])
            tensors[f"{prefix}.prequant_scaling_factor"] = torch.ones(in_f, dtype=torch.float16)
        elif algo == "W4A16_AWQ":
            blocks = weight.reshape(out_f, in_f // group_size, group_size)
            scale = blocks.abs().amax(dim=2) / 7.0
            codes = torch.round(blocks / scale[:, :, None]).clamp(-8, 7).reshape(out_f, in_f)
            tensors[name] = pack_int4(codes.to(torch.int8))
            tensors[f"{prefix}.weights_scaling_factor"] = scale
            tensors[f"{prefix}.prequant_scaling_factor"] = torch.ones(in_f, dtype=torch.float16)
        else:
            raise ValueError(algo)


def add_kv_cache_scales(tensors: dict[str, torch.Tensor], num_layers: int, k_scale: float, v_scale: float) -> None:
    for layer in range(num_layers):
        prefix = f"transformer.layers.{layer}.attention."
        tensors[prefix + "k_cache_scaling_factor"] = torch.tensor([k_scale])
        tensors[prefix + "v_cache_scaling_factor"] = torch.tensor([v_scale])
        tensors[prefix + "kv_cache_scaling_factor"] = torch.tensor([max(k_scale, v_scale)])
