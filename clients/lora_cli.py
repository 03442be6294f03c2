"""`trtllm-pipeline lora convert ADAPTER_DIR OUT_DIR`: a PEFT adapter as NVIDIA's LoRA request tensors (lora_tensors.py).

`add_lora_arguments(parser)` + `run_lora(args)` plug into the pipeline's CLI. A directory that cannot be converted is
reported in one line on stderr with exit code 2 (a bad input, as `validate`'s).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

EXIT_BAD_INPUT = 2


def add_lora_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    actions = parser.add_subparsers(dest="lora_command", required=True, metavar="ACTION")
    convert = actions.add_parser(
        "convert",
        help="write a PEFT adapter as model.lora_weights.npy / model.lora_config.npy (TensorRT-LLM's hf_lora_convert.py layout)",
        description="Convert a Hugging Face PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) into the "
        "lora_weights / lora_config tensors that a LoRA request sends, in the files NVIDIA's inflight_batcher_llm_client.py "
        "--lora-path reads.",
    )
    convert.add_argument("adapter_dir", type=Path, help="the PEFT adapter directory")
    convert.add_argument("out_dir", type=Path, help="where to write model.lora_weights.npy and model.lora_config.npy (created)")
    convert.add_argument(
        "--dtype",
        choices=["float16", "float32"],
        default="float16",
        help="lora_weights' dtype (default float16, the contract's FP16; it must match the engine's LoRA dtype)",
    )
    return parser


def run_lora(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from clients.lora_tensors import LoraAdapterError, convert_peft_adapter, write_lora_tensors

    out, err = out or sys.stdout, err or sys.stderr
    try:
        tensors = convert_peft_adapter(args.adapter_dir, args.dtype)
        weights_file, config_file = write_lora_tensors(tensors, args.out_dir)
    except (LoraAdapterError, OSError) as exc:
        print(f"error: {exc}", file=err)
        return EXIT_BAD_INPUT
    rows, width = tensors.weights.shape[1:]
    print(f"wrote {weights_file} ({rows} rows of {width} {args.dtype} values) and {config_file}", file=out)
    return 0
