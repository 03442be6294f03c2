#!/usr/bin/env python3
"""Train a small Hugging Face PEFT LoRA adapter for the embedded default model (``models/tiny-stdlib-llama``).

The adapter is trained on a narrow slice of the default model's *held-out* text (``data/heldout/
stdlib_heldout.txt``, files the base model never saw): one standard-library module, ``turtle.py`` by default.
The module's lines are split once: the first part trains the adapter, the tail (``--eval-fraction``) is kept
out of training and measures it. Base and adapter are compared on that tail (the adapter must lower the loss)
and on the other held-out files (where a narrow adapter has no reason to help).

Outputs, in ``--out``: ``adapter_config.json`` + ``adapter_model.safetensors`` (float16, the base model's
dtype: TensorRT-LLM applies an adapter in the engine's lora_plugin dtype), ``training_record.json`` (data slice,
steps, rank, modules, losses) and ``README.md``.

Usage::

    .venv/bin/python scripts/train_lora_adapter.py --out models/tiny-stdlib-llama-turtle-lora --threads 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import train_default_model as recipe

# PEFT module names in TensorRT-LLM's order (attn_q, attn_k, attn_v, attn_dense, mlp_h_to_4h, mlp_gate,
# mlp_4h_to_h): every linear layer of a Llama decoder layer, so that the adapter exercises every LoRA module.
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
RECORD = "training_record.json"


def heldout_files(heldout_text: str) -> dict[str, str]:
    """The held-out text split back into its files (each preceded by the recipe's 3-line header)."""
    files: dict[str, str] = {}
    lines = heldout_text.split("\n")
    index = 0
    while index < len(lines):
        if lines[index] == recipe.SEPARATOR and index + 2 < len(lines) and lines[index + 1].startswith("# file: "):
            name = lines[index + 1][len("# file: ") :]
            end = index + 3
            while end < len(lines) and not (lines[end] == recipe.SEPARATOR and end + 1 < len(lines) and lines[end + 1].startswith("# file: ")):
                end += 1
            files[name] = "\n".join(lines[index + 3 : end]) + "\n"
            index = end
        else:
            index += 1
    return files


def data_slice(heldout_text: str, source_file: str, eval_fraction: float) -> tuple[str, str, int]:
    """(training text, evaluation text, first evaluation line) of `source_file`: its lines split once, the tail
    (`eval_fraction` of the lines) for evaluation."""
    files = heldout_files(heldout_text)
    if source_file not in files:
        raise SystemExit(f"--file {source_file} is not one of the held-out files: {', '.join(sorted(files))}")
    lines = files[source_file].splitlines(keepends=True)
    split = int(len(lines) * (1.0 - eval_fraction))
    return "".join(lines[:split]), "".join(lines[split:]), split + 1


def token_stream(tok, text: str) -> torch.Tensor:
    """`text` as one token stream after a BOS (as the base model's held-out perplexity is measured)."""
    return torch.tensor([recipe.BOS_ID] + tok.backend_tokenizer.encode(text, add_special_tokens=False).ids)


def mean_nll(model, stream: torch.Tensor, max_windows: int | None = None) -> float:
    """Mean next-token NLL (nats) over non-overlapping SEQ_LEN windows of `stream`."""
    nll, _, _ = recipe.eval_ppl(model, stream, max_windows=max_windows)
    return round(nll, 4)


def base_and_adapter_nll(model, stream: torch.Tensor, max_windows: int | None = None) -> tuple[float, float]:
    with model.disable_adapter():
        base = mean_nll(model, stream, max_windows)
    return base, mean_nll(model, stream, max_windows)


def attach_lora(base_model, rank: int, alpha: int, dropout: float):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(MODULES), bias="none", task_type="CAUSAL_LM")
    return get_peft_model(base_model, config)


def train(model, stream: torch.Tensor, args, evaluate) -> list[dict]:
    """AdamW on the LoRA weights, batches of random SEQ_LEN windows of `stream`; `evaluate()` every --eval-every."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(recipe.SEED)
    last_start = len(stream) - recipe.SEQ_LEN - 1
    history, ema, started = [], None, time.time()
    model.train()
    for step in range(1, args.steps + 1):
        for group in opt.param_groups:
            group["lr"] = recipe.lr_at(step - 1, args.steps, args.lr, args.warmup)
        starts = torch.randint(0, last_start, (args.batch,), generator=gen).tolist()
        batch = torch.stack([stream[s : s + recipe.SEQ_LEN + 1] for s in starts])
        logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.9 * ema + 0.1 * loss.item()
        if step % args.eval_every == 0 or step == args.steps:
            row = {"step": step, "train_loss_ema": round(ema, 4), "eval_nll": evaluate(), "seconds": round(time.time() - started, 1)}
            history.append(row)
            recipe.log(f"step {step}/{args.steps} {row}")
        if time.time() - started > args.minutes * 60:
            recipe.log(f"--minutes {args.minutes:g} spent at step {step}; stopping")
            history.append({"step": step, "train_loss_ema": round(ema, 4), "eval_nll": evaluate(), "seconds": round(time.time() - started, 1)})
            break
    return history


def save_adapter(model, out_dir: Path, base_dir: str) -> None:
    """adapter_config.json + float16 adapter_model.safetensors; target_modules in a fixed order (PEFT writes a
    set's iteration order, which changes from run to run)."""
    for name, param in model.named_parameters():
        if "lora_" in name:
            param.data = param.data.to(torch.float16)
    model.peft_config["default"].base_model_name_or_path = base_dir
    model.save_pretrained(str(out_dir), safe_serialization=True)
    config_file = out_dir / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["target_modules"] = list(MODULES)
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for path in out_dir.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; containers may run as another uid


def reloaded_nll(base_dir: str, out_dir: Path, streams) -> list[tuple[float, float]]:
    """Base and saved-adapter NLL on each (stream, max_windows), the adapter loaded from disk as a user would
    (transformers + peft)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, local_files_only=True, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(out_dir)).eval()
    return [base_and_adapter_nll(model, stream, max_windows) for stream, max_windows in streams]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_readme(out_dir: Path, record: dict) -> None:
    s, d = record["result"], record["data"]
    text = f"""# tiny-stdlib-llama-turtle-lora

A rank-{record["rank"]} Hugging Face PEFT LoRA adapter for `models/tiny-stdlib-llama` (the embedded default
model), trained by `scripts/train_lora_adapter.py` on one module of the base model's held-out text: the
first {d["train_lines"]} lines of `{d["file"]}` in `data/heldout/stdlib_heldout.txt`. Its lines from
{d["eval_first_line"]} to the end (the last {d["eval_fraction"]:.0%}) were kept out of training and measure the adapter.
It is a test fixture for multi-LoRA serving: small (float16, {record["adapter_bytes"]:,} bytes), on every
linear layer of the decoder (PEFT {", ".join(MODULES)};
TensorRT-LLM {", ".join(record["trtllm_modules"])}), with an effect large enough to see.

| mean next-token NLL (nats) | base | with the adapter |
|---|---|---|
| held-out tail of `{d["file"]}` ({d["eval_tokens"]:,} tokens) | {s["eval_nll_base"]} | {s["eval_nll_adapter"]} |
| the other held-out files (first {record["other_windows"]} windows) | {s["other_nll_base"]} | {s["other_nll_adapter"]} |

Training: {record["steps"]} steps of AdamW (lr {record["lr"]:g}, {record["warmup"]} warm-up steps, cosine decay),
batch {record["batch"]} × {record["seq_len"]} tokens at random offsets of the training lines
({d["train_tokens"]:,} tokens), lora_alpha {record["alpha"]}, dropout {record["dropout"]:g},
{record["threads"]} CPU thread(s), {record["train_minutes"]} min. Every figure: `{RECORD}`.

Reproduce: `{record["command"]}`
"""
    (out_dir / "README.md").write_text(text, encoding="utf-8")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="models/tiny-stdlib-llama")
    ap.add_argument("--data-out", default="data", help="the directory holding heldout/stdlib_heldout.txt")
    ap.add_argument("--file", default="turtle.py", help="the held-out module the adapter specialises in")
    ap.add_argument("--eval-fraction", type=float, default=0.2, help="tail of the module's lines kept for evaluation")
    ap.add_argument("--out", default="models/tiny-stdlib-llama-turtle-lora")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=int, default=16)
    ap.add_argument("--dropout", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=40)
    ap.add_argument("--other-windows", type=int, default=24, help="windows of the other held-out files to evaluate")
    ap.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget of the training loop")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if not 0.05 <= args.eval_fraction <= 0.5:
        raise SystemExit(f"--eval-fraction must be within 0.05..0.5, got {args.eval_fraction:g}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(recipe.SEED)
    started = time.time()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    heldout_text = (Path(args.data_out) / "heldout" / "stdlib_heldout.txt").read_text(encoding="utf-8")
    train_text, eval_text, eval_first_line = data_slice(heldout_text, args.file, args.eval_fraction)
    others = "".join(text for name, text in heldout_files(heldout_text).items() if name != args.file)
    tok = AutoTokenizer.from_pretrained(args.base, local_files_only=True)
    train_stream, eval_stream, other_stream = (token_stream(tok, t) for t in (train_text, eval_text, others))
    recipe.log(f"{args.file}: {len(train_stream):,} training tokens, {len(eval_stream):,} evaluation tokens")

    base = AutoModelForCausalLM.from_pretrained(args.base, local_files_only=True, dtype=torch.float32)
    model = attach_lora(base, args.rank, args.alpha, args.dropout)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    loop_start = time.time()
    history = train(model, train_stream, args, lambda: mean_nll(model, eval_stream))
    train_minutes = round((time.time() - loop_start) / 60, 2)
    save_adapter(model, out_dir, args.base)
    (eval_base, eval_adapter), (other_base, other_adapter) = reloaded_nll(args.base, out_dir, [(eval_stream, None), (other_stream, args.other_windows)])
    if not eval_adapter < eval_base:
        raise SystemExit(f"the adapter did not lower the held-out loss of {args.file}: {eval_adapter} >= {eval_base}")
    from pipeline.config.lora_adapters import HF_TO_TRTLLM_MODULE

    record = {
        "base": args.base,
        "rank": args.rank,
        "alpha": args.alpha,
        "dropout": args.dropout,
        "peft_modules": list(MODULES),
        "trtllm_modules": [HF_TO_TRTLLM_MODULE[name] for name in MODULES],
        "trainable_params": trainable,
        "steps": history[-1]["step"],
        "batch": args.batch,
        "seq_len": recipe.SEQ_LEN,
        "lr": args.lr,
        "warmup": args.warmup,
        "threads": args.threads,
        "train_minutes": train_minutes,
        "total_minutes": round((time.time() - started) / 60, 2),
        "other_windows": args.other_windows,
        "adapter_bytes": (out_dir / "adapter_model.safetensors").stat().st_size,
        "data": {
            "source": f"{args.data_out}/heldout/stdlib_heldout.txt",
            "file": args.file,
            "eval_fraction": args.eval_fraction,
            "train_lines": eval_first_line - 1,
            "eval_first_line": eval_first_line,
            "train_tokens": len(train_stream),
            "eval_tokens": len(eval_stream),
            "train_sha256": _sha(train_text),
            "eval_sha256": _sha(eval_text),
        },
        "result": {
            "eval_nll_base": eval_base,
            "eval_nll_adapter": eval_adapter,
            "eval_nll_drop": round(eval_base - eval_adapter, 4),
            "other_nll_base": other_base,
            "other_nll_adapter": other_adapter,
            "measured": "the saved float16 adapter reloaded onto the base model (transformers + peft; base: the "
            "adapter disabled), fp32 compute, mean NLL in nats over non-overlapping 256-token windows "
            "after one BOS",
        },
        "history": history,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": sys.modules["transformers"].__version__,
            "peft": sys.modules["peft"].__version__,
        },
        "command": "python scripts/train_lora_adapter.py " + shlex.join(sys.argv[1:] if argv is None else argv),
    }
    (out_dir / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    write_readme(out_dir, record)
    recipe.log(f"held-out tail of {args.file}: base {eval_base} -> adapter {eval_adapter} nats/token; wrote {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
