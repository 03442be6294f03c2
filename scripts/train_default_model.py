#!/usr/bin/env python3
"""Train the project's embedded default model: ``models/tiny-stdlib-llama``.

A ~5.2 M parameter Llama-architecture causal LM (GQA, RoPE, SwiGLU, RMSNorm)
with its own 4096-entry byte-level BPE tokenizer, trained from scratch on CPU
on the Python standard library's own ``.py`` sources (CPython, PSF license).

Everything is deterministic given the same interpreter stdlib, library versions
and CLI arguments:

* the file list is sorted, and each file is assigned to train / held-out by a
  SHA-256 hash of its path relative to the stdlib dir (~90 % / ~10 %);
* tokenizer training, model init and batch sampling use fixed seeds.

(Bit-exact reproduction of the weights additionally needs the same torch build
and thread count, because CPU float reductions are not order-stable.)

Outputs
-------
``<out>/``                     config.json, generation_config.json,
                               model.safetensors (float16), tokenizer files,
                               README.md (model card)
``<data-out>/heldout/stdlib_heldout.txt``   held-out text (perplexity eval)
``<data-out>/calibration/stdlib_calib.txt`` train-split text (PTQ calibration)
``<data-out>/README.md``

Usage::

    .venv/bin/python scripts/train_default_model.py \\
        --out models/tiny-stdlib-llama --data-out data \\
        --steps 1000 --minutes 20 --threads 2

``--draft-of DIR`` trains a speculative-decoding draft of a trained model instead (fewer layers,
``--draft-layers``; initialised from it and distilled towards it): see ``train_draft_model.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import sys
import sysconfig
import time
from pathlib import Path

import torch

# --------------------------------------------------------------------------
# constants (the recipe)
# --------------------------------------------------------------------------
SEED = 1234
VOCAB_SIZE = 4096
PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"  # ids 0, 1, 2
SEQ_LEN = 256
MAX_FILE_BYTES = 200 * 1024
MAX_TRAIN_BYTES = 20 * 1024 * 1024
HELDOUT_PERCENT = 10
HELDOUT_TARGET_BYTES = 300 * 1024
CALIB_TARGET_BYTES = 150 * 1024
SEPARATOR = "# " + "=" * 70  # separator line between files in the data/*.txt files

MODEL_KW = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=1024,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    hidden_act="silu",
    tie_word_embeddings=False,
    attention_bias=False,
    mlp_bias=False,
    initializer_range=0.02,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

# Directory names (any path component) that are excluded from the corpus.
EXCLUDE_DIRS = {
    "site-packages",  # third-party code, not the stdlib
    "test",
    "tests",
    "idle_test",
    "idlelib",
    "turtledemo",
    "__pycache__",
    "lib-dynload",
    "ensurepip",
}
# Prefixes (relative posix paths) excluded in addition.
EXCLUDE_PREFIXES = (
    "config-",  # config-3.x-<platform>/ build files
    "lib2to3/tests",
    "pydoc_data/",  # huge generated docs dict, not code
    "_sysconfigdata",  # generated, machine specific
    "encodings/cp",  # generated charmap tables
    "encodings/iso8859",
    "encodings/mac_",
    "encodings/koi8",
    "encodings/kz1048",
    "encodings/ptcp154",
    "encodings/hp_roman8",
    "encodings/palmos",
    "encodings/tis_620",
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------
def base_stdlib_dir() -> Path:
    """The *base* interpreter's stdlib dir (not a venv's)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    if not (stdlib / "os.py").exists():  # pragma: no cover - exotic layouts
        stdlib = Path(os.__file__).parent
    return stdlib.resolve()


def is_heldout(rel: str) -> bool:
    h = int.from_bytes(hashlib.sha256(rel.encode("utf-8")).digest()[:8], "big")
    return h % 100 < HELDOUT_PERCENT


def hash_key(rel: str) -> str:
    return hashlib.sha256(("order:" + rel).encode("utf-8")).hexdigest()


def excluded(rel: str) -> bool:
    parts = rel.split("/")
    if any(p in EXCLUDE_DIRS for p in parts[:-1]):
        return True
    if parts[-1].startswith("test_"):
        return True
    return rel.startswith(EXCLUDE_PREFIXES)


def read_source(path: Path) -> str | None:
    raw = path.read_bytes()
    for enc in ("utf-8", "latin-1"):
        try:
            text = raw.decode(enc)
            break
        except UnicodeDecodeError:
            continue
    else:  # pragma: no cover - latin-1 always decodes
        return None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\x00" in text or not text.strip():
        return None
    return text


def collect_corpus(stdlib: Path):
    """Return (train_docs, heldout_docs) as sorted lists of (relpath, text)."""
    files = sorted(p for p in stdlib.rglob("*.py") if p.is_file())
    train, held = [], []
    n_big = n_excl = 0
    train_bytes = 0
    for p in files:
        rel = p.relative_to(stdlib).as_posix()
        if excluded(rel):
            n_excl += 1
            continue
        if p.stat().st_size > MAX_FILE_BYTES:
            n_big += 1
            continue
        text = read_source(p)
        if text is None:
            continue
        if is_heldout(rel):
            held.append((rel, text))
        else:
            nb = len(text.encode("utf-8"))
            if train_bytes + nb > MAX_TRAIN_BYTES:
                continue
            train_bytes += nb
            train.append((rel, text))
    log(
        f"corpus: {len(files)} .py files under {stdlib}; excluded {n_excl}, "
        f"too big {n_big}; train {len(train)} files / {train_bytes / 1e6:.2f} MB, "
        f"held-out {len(held)} files / "
        f"{sum(len(t.encode()) for _, t in held) / 1e6:.2f} MB"
    )
    return train, held


def concat_subset(docs, target_bytes: int, max_bytes: int):
    """Deterministically pick whole files (hash order) until target_bytes."""
    picked, total = [], 0
    for rel, text in sorted(docs, key=lambda d: hash_key(d[0])):
        nb = len(text.encode("utf-8"))
        if total + nb > max_bytes:
            continue
        picked.append((rel, text))
        total += nb
        if total >= target_bytes:
            break
    picked.sort()
    out = []
    for rel, text in picked:
        out.append(f"{SEPARATOR}\n# file: {rel}\n{SEPARATOR}\n")
        out.append(text if text.endswith("\n") else text + "\n")
    return "".join(out), [r for r, _ in picked]


# --------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------
def train_tokenizer(texts, out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(texts, trainer=trainer, length=len(texts))
    assert tk.token_to_id(PAD) == 0 and tk.token_to_id(BOS) == 1 and tk.token_to_id(EOS) == 2
    assert tk.get_vocab_size() == VOCAB_SIZE, tk.get_vocab_size()
    tk.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B:1",
        special_tokens=[(BOS, 1)],
    )
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=MODEL_KW["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
    hf_tok.save_pretrained(str(out_dir))
    return hf_tok


def check_tokenizer(out_dir: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out_dir), local_files_only=True)
    samples = [
        "def foo(x):\n    return x + 1\n",
        "héllo wörld — 日本語",
        "  leading spaces\ttabs\n\n\ntrailing   ",
        "emoji 🐍 and \x7f control",
    ]
    for s in samples:
        ids = tok(s)["input_ids"]
        assert ids[0] == tok.bos_token_id == 1, ids[:3]
        back = tok.decode(ids, skip_special_tokens=True)
        assert back == s, (s, back)
    assert tok.pad_token_id == 0 and tok.eos_token_id == 2
    log(f"tokenizer round-trip OK ({type(tok).__name__}, vocab {len(tok)})")
    return tok


def encode_docs(tok, docs):
    """Concatenate <|bos|> doc <|eos|> for every doc into one int32 stream."""
    import torch

    texts = [t for _, t in docs]
    enc = tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    stream = []
    for e in enc:
        stream.append(BOS_ID)
        stream.extend(e.ids)
        stream.append(EOS_ID)
    return torch.tensor(stream, dtype=torch.long)


BOS_ID, EOS_ID, PAD_ID = 1, 2, 0


# --------------------------------------------------------------------------
# model / training
# --------------------------------------------------------------------------
def build_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**MODEL_KW)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(cfg)
    return model


def eval_ppl(model, stream, seq_len=SEQ_LEN, batch=16, max_windows=None):
    """Mean token NLL over non-overlapping windows of the token stream."""
    import torch
    import torch.nn.functional as F

    model.eval()
    torch.set_grad_enabled(False)
    n_win = (len(stream) - 1) // seq_len
    if max_windows:
        n_win = min(n_win, max_windows)
    tot_nll, tot_tok = 0.0, 0
    for i in range(0, n_win, batch):
        idx = range(i, min(i + batch, n_win))
        x = torch.stack([stream[j * seq_len : j * seq_len + seq_len] for j in idx])
        y = torch.stack([stream[j * seq_len + 1 : j * seq_len + seq_len + 1] for j in idx])
        logits = model(input_ids=x).logits.float()
        nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum")
        tot_nll += nll.item()
        tot_tok += y.numel()
    torch.set_grad_enabled(True)
    model.train()
    mean = tot_nll / max(tot_tok, 1)
    return mean, math.exp(mean), tot_tok


def lr_at(step, total, peak, warmup, min_ratio=0.1):
    if step < warmup:
        return peak * (step + 1) / warmup
    prog = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * prog)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="models/tiny-stdlib-llama")
    ap.add_argument("--data-out", default="data")
    ap.add_argument("--steps", type=int, default=1000, help="max optimizer steps")
    ap.add_argument("--minutes", type=float, default=20.0, help="wall-clock budget for the training loop")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--stdlib", default=None, help="override the stdlib dir (default: base interpreter's)")
    ap.add_argument(
        "--draft-of",
        default=None,
        help="train a speculative-decoding draft of this trained model instead: its tokenizer is copied, "
        "its embeddings / first layers / final norm / lm_head initialise the draft, which is distilled "
        "towards its logits (--out then receives the draft; --data-out is not written)",
    )
    ap.add_argument("--draft-layers", type=int, default=1, help="decoder layers of the draft (--draft-of)")
    ap.add_argument("--draft-intermediate", type=int, default=None, help="MLP width of the draft (default: the target's)")
    ap.add_argument("--distill-weight", type=float, default=0.8, help="weight of KL(target || draft) against next-token CE")
    ap.add_argument(
        "--self-distill",
        type=float,
        default=0.0,
        help="fraction of each draft batch taken from the target's own greedy continuations (--draft-of)",
    )
    ap.add_argument("--generated", type=int, default=256, help="greedy continuations to generate (--self-distill)")
    ap.add_argument("--draft-init", default=None, help="start the draft from this earlier draft (--draft-of)")
    args = ap.parse_args(argv)
    if args.draft_of:
        import train_draft_model

        return train_draft_model.train_draft(args, sys.modules[__name__])

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    random.seed(SEED)
    t_start = time.time()

    out_dir = Path(args.out)
    data_dir = Path(args.data_out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*"):
        if stale.is_file():
            stale.unlink()

    # ---- data ------------------------------------------------------------
    stdlib = Path(args.stdlib).resolve() if args.stdlib else base_stdlib_dir()
    train_docs, held_docs = collect_corpus(stdlib)
    held_text, held_files = concat_subset(held_docs, HELDOUT_TARGET_BYTES, 400 * 1024)
    calib_text, calib_files = concat_subset(train_docs, CALIB_TARGET_BYTES, 200 * 1024)
    assert not set(held_files) & set(calib_files)
    (data_dir / "heldout").mkdir(parents=True, exist_ok=True)
    (data_dir / "calibration").mkdir(parents=True, exist_ok=True)
    (data_dir / "heldout" / "stdlib_heldout.txt").write_text(held_text, encoding="utf-8")
    (data_dir / "calibration" / "stdlib_calib.txt").write_text(calib_text, encoding="utf-8")
    log(
        f"wrote heldout {len(held_text.encode()) / 1024:.0f} KiB ({len(held_files)} files), "
        f"calibration {len(calib_text.encode()) / 1024:.0f} KiB ({len(calib_files)} files)"
    )

    # ---- tokenizer -----------------------------------------------------
    t0 = time.time()
    train_tokenizer([t for _, t in train_docs], out_dir)
    tok = check_tokenizer(out_dir)
    t_tok = time.time() - t0
    train_stream = encode_docs(tok, train_docs)
    held_stream = tok.backend_tokenizer.encode(held_text, add_special_tokens=False).ids
    held_stream = torch.tensor([BOS_ID] + held_stream, dtype=torch.long)
    train_bytes = sum(len(t.encode()) for _, t in train_docs)
    log(
        f"tokenizer trained in {t_tok:.1f}s; train stream {len(train_stream):,} tokens "
        f"({train_bytes / len(train_stream):.2f} bytes/token); held-out {len(held_stream):,} tokens"
    )

    # ---- model -----------------------------------------------------------
    model = build_model()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params:,} params")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    gen = torch.Generator().manual_seed(SEED)
    max_start = len(train_stream) - SEQ_LEN - 1

    def get_batch():
        starts = torch.randint(0, max_start, (args.batch,), generator=gen)
        x = torch.stack([train_stream[s : s + SEQ_LEN] for s in starts.tolist()])
        y = torch.stack([train_stream[s + 1 : s + SEQ_LEN + 1] for s in starts.tolist()])
        return x, y

    # The schedule length is decided up front: --steps, shortened if the
    # measured step time says --minutes would not allow them.
    import torch.nn.functional as F

    model.train()
    budget_s = args.minutes * 60.0
    total_steps = args.steps
    step = 0
    t_train = time.time()
    ema = None
    history = []
    t_mark, step_mark = 0.0, 0
    while step < total_steps:
        lr = lr_at(step, total_steps, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = get_batch()
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        lv = loss.item()
        ema = lv if ema is None else 0.9 * ema + 0.1 * lv
        elapsed = time.time() - t_train
        if step % 25 == 0:
            # (Re-)plan the cosine schedule from the recent speed so that it
            # completes within --minutes on a shared machine: the number of
            # steps that fit in the remaining time, capped at --steps. Late in
            # the schedule (> 80 %) it may only shrink, to keep the lr tail smooth.
            recent = (elapsed - t_mark) / (step - step_mark)
            t_mark, step_mark = elapsed, step
            fit = min(args.steps, step + int(max(0.0, budget_s - elapsed) / recent))
            fit = max(fit, step + 1, args.warmup + 10)
            if step > 0.8 * total_steps:
                fit = min(fit, total_steps)
            if fit != total_steps:
                log(f"recent {recent:.2f}s/step -> schedule {total_steps} -> {fit} steps")
                total_steps = fit
        if step % args.log_every == 0 or step == total_steps:
            history.append((step, round(lv, 4), round(ema, 4)))
            log(f"step {step}/{total_steps} loss {lv:.4f} (ema {ema:.4f}) lr {lr:.2e} gnorm {float(gnorm):.2f} {elapsed:.0f}s ({elapsed / step:.2f}s/step)")
        if elapsed > budget_s * 1.10 and step < total_steps:  # safety net: the machine slowed down
            log(f"time budget exhausted at step {step}")
            break
    train_time = time.time() - t_train
    final_ema = ema

    # ---- evaluation --------------------------------------------------------
    held_nll, held_ppl, held_ntok = eval_ppl(model, held_stream)
    log(f"held-out (fp32): nll {held_nll:.4f} ppl {held_ppl:.2f} over {held_ntok:,} tokens")
    tr_nll, tr_ppl, _ = eval_ppl(model, train_stream[: len(held_stream)], max_windows=None)
    log(f"train-sample (fp32): nll {tr_nll:.4f} ppl {tr_ppl:.2f}")

    # ---- save (float16 safetensors) -----------------------------------------
    model = model.to(torch.float16)
    model.config.dtype = torch.float16
    model.generation_config.bos_token_id = BOS_ID
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = PAD_ID
    model.save_pretrained(str(out_dir), safe_serialization=True)
    patch_compat(out_dir)
    for f in out_dir.iterdir():
        f.chmod(0o644)  # safetensors writes 0600; containers may run as another uid
    # fp16 evaluation of the saved artefact (what the pipeline starts from)
    from transformers import AutoModelForCausalLM

    m16 = AutoModelForCausalLM.from_pretrained(str(out_dir), local_files_only=True, dtype=torch.float32)
    held16_nll, held16_ppl, _ = eval_ppl(m16, held_stream)
    log(f"held-out after fp16 round-trip (evaluated in fp32): ppl {held16_ppl:.2f}")

    samples = []
    samples = generate_samples(m16, tok)

    size = (out_dir / "model.safetensors").stat().st_size
    total_time = time.time() - t_start
    stats = dict(
        params=n_params,
        safetensors_bytes=size,
        steps=step,
        planned_steps=total_steps,
        batch=args.batch,
        seq_len=SEQ_LEN,
        tokens_seen=step * args.batch * SEQ_LEN,
        train_minutes=round(train_time / 60, 2),
        total_minutes=round(total_time / 60, 2),
        final_train_loss_ema=round(final_ema, 4),
        final_train_loss_last=round(lv, 4),
        train_sample_ppl=round(tr_ppl, 3),
        heldout_nll=round(held_nll, 4),
        heldout_ppl=round(held_ppl, 3),
        heldout_ppl_fp16_weights=round(held16_ppl, 3),
        heldout_tokens=held_ntok,
        train_files=len(train_docs),
        train_bytes=train_bytes,
        train_tokens=len(train_stream),
        heldout_files_total=len(held_docs),
        heldout_files_in_txt=len(held_files),
        calib_files=len(calib_files),
        threads=args.threads,
        python=platform.python_version(),
        torch=torch.__version__,
        transformers=__import__("transformers").__version__,
        tokenizers=__import__("tokenizers").__version__,
        history=history,
    )
    write_model_card(out_dir, stats, args, samples)
    write_data_readme(data_dir, stats, held_files, calib_files, held_text, calib_text, args)
    log("stats: " + json.dumps({k: v for k, v in stats.items() if k != "history"}))
    log(f"done in {total_time / 60:.1f} min")
    return stats


SAMPLE_PROMPTS = ["def", "import", "class", "def __init__(self", "def "]


def generate_samples(model, tok, max_new_tokens=48):
    samples = []
    for prompt in SAMPLE_PROMPTS:
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            outg = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=PAD_ID)
        samples.append((prompt, tok.decode(outg[0], skip_special_tokens=True)))
        log(f"sample greedy {prompt!r}:\n{samples[-1][1]}\n---")
    return samples


def patch_compat(out_dir: Path) -> None:
    """Make the saved files loadable by transformers 4.x-era tools too.

    transformers 5 writes ``rope_parameters`` / ``dtype`` and a
    ``TokenizersBackend`` tokenizer class; older loaders (TensorRT-LLM's
    checkpoint converters, transformers 4.x in serving containers) look for
    ``rope_theta`` / ``torch_dtype`` / ``PreTrainedTokenizerFast``. Adding the
    legacy keys with identical values is harmless for transformers 5.
    """
    cfg_p = out_dir / "config.json"
    cfg = json.loads(cfg_p.read_text())
    cfg["rope_theta"] = MODEL_KW["rope_theta"]
    cfg["torch_dtype"] = "float16"
    cfg["dtype"] = "float16"
    cfg_p.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tc_p = out_dir / "tokenizer_config.json"
    tc = json.loads(tc_p.read_text())
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    for k in ("is_local", "local_files_only", "name_or_path"):
        tc.pop(k, None)
    tc_p.write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")
    assert not list(out_dir.glob("*.bin")) and not list(out_dir.glob("*.pt")), "pickled files written"


def _cmd(args) -> str:
    return (
        ".venv/bin/python scripts/train_default_model.py "
        f"--out {args.out} --data-out {args.data_out} --steps {args.steps} "
        f"--minutes {args.minutes:g} --threads {args.threads}"
    )


def write_model_card(out_dir: Path, s: dict, args, samples) -> None:
    hist = "\n".join(f"| {st} | {loss:.3f} | {e:.3f} |" for st, loss, e in s["history"][:: max(1, len(s["history"]) // 12)])
    sample_md = "\n\n".join(f"Prompt `{p!r}`:\n\n```python\n{t}\n```" for p, t in samples)
    card = f"""---
license: psf-2.0
language: [code]
library_name: transformers
pipeline_tag: text-generation
tags: [llama, tiny, python, cpu, test-model]
---

# tiny-stdlib-llama

The embedded default model of **trtllm-pipeline**: a tiny Llama-architecture
causal LM trained from scratch, on CPU, on the `.py` sources of CPython's
standard library. It is small enough to commit to the repository ({s["safetensors_bytes"] / 1e6:.1f} MB),
loads offline with `AutoModelForCausalLM` / `AutoTokenizer`, produces
recognisably Python-like text, and is trained enough that quantization has a
measurable effect on perplexity. It is a test fixture, **not** a useful code model.

## Architecture

| field | value |
|---|---|
| architecture | `LlamaForCausalLM` (RMSNorm, RoPE, SwiGLU MLP, no biases) |
| parameters | {s["params"]:,} |
| vocab_size | {MODEL_KW["vocab_size"]} (byte-level BPE, this repo's own) |
| hidden_size / intermediate_size | {MODEL_KW["hidden_size"]} / {MODEL_KW["intermediate_size"]} |
| layers | {MODEL_KW["num_hidden_layers"]} |
| attention heads / KV heads (GQA) / head_dim | {MODEL_KW["num_attention_heads"]} / {MODEL_KW["num_key_value_heads"]} / {MODEL_KW["head_dim"]} |
| max_position_embeddings | {MODEL_KW["max_position_embeddings"]} (trained on {SEQ_LEN}-token windows) |
| rope_theta | {MODEL_KW["rope_theta"]:g} |
| rms_norm_eps | {MODEL_KW["rms_norm_eps"]:g} |
| tie_word_embeddings | false |
| stored dtype | float16 (`model.safetensors`, {s["safetensors_bytes"]:,} bytes) |
| special tokens | `<|pad|>`=0, `<|bos|>`=1, `<|eos|>`=2 |

## Tokenizer

`tokenizers` byte-level BPE (GPT-2 style pre-tokenizer regex,
`add_prefix_space=False`), {VOCAB_SIZE} entries including the 3 special tokens,
trained on the training split below. The post-processor prepends `<|bos|>`
(`TemplateProcessing "<|bos|> $A"`); documents end with `<|eos|>`. Decoding with
`skip_special_tokens=True` round-trips any UTF-8 text exactly (byte level, no
unknown tokens). Wrapped as `PreTrainedTokenizerFast`
(`clean_up_tokenization_spaces=False`, `padding_side="left"`).

## Data

CPython {s["python"]} standard library `.py` files (the base interpreter's
`sysconfig.get_paths()["stdlib"]`), excluding `site-packages/`, test directories
(`test/`, `tests/`, `idle_test/`, `test_*.py`), `idlelib/`, `turtledemo/`,
`lib2to3/tests`, `ensurepip/`, `pydoc_data/`, generated codec tables
(`encodings/cp*`, `iso8859_*`, `mac_*`, ...), `_sysconfigdata*` and files
larger than 200 KB. Each file goes to the held-out split iff
`sha256(relative_path)[:8] % 100 < {HELDOUT_PERCENT}`.

* train: {s["train_files"]} files, {s["train_bytes"] / 1e6:.2f} MB, {s["train_tokens"]:,} tokens
  ({s["train_bytes"] / s["train_tokens"]:.2f} bytes/token)
* held-out: {s["heldout_files_total"]} files, of which {s["heldout_files_in_txt"]} are in
  `data/heldout/stdlib_heldout.txt` (used for the perplexity below)
* `data/calibration/stdlib_calib.txt`: {s["calib_files"]} *train* files for PTQ calibration

## Training

From random init (seed {SEED}), fp32, `torch.set_num_threads({s["threads"]})` on a
2-core CPU: AdamW (betas 0.9/0.95, weight decay 0.1 on matrices, grad-clip 1.0),
peak lr {args.lr:g} with {args.warmup} warm-up steps then cosine decay to 10 %,
batch {s["batch"]} x {s["seq_len"]} tokens sampled at random offsets from the packed
token stream (`<|bos|> doc <|eos|>` per file).

* steps: {s["steps"]} ({s["tokens_seen"]:,} tokens seen, ~{s["tokens_seen"] / s["train_tokens"]:.2f} epochs)
* training-loop time: {s["train_minutes"]} min (whole script {s["total_minutes"]} min)
* final train loss: {s["final_train_loss_ema"]:.3f} (EMA; last batch {s["final_train_loss_last"]:.3f});
  train-sample perplexity {s["train_sample_ppl"]:.2f}
* **held-out perplexity: {s["heldout_ppl"]:.2f}** (mean NLL {s["heldout_nll"]:.3f} nats/token over
  {s["heldout_tokens"]:,} tokens, non-overlapping {SEQ_LEN}-token windows, fp32 weights)
* held-out perplexity of the saved float16 weights (upcast to fp32): {s["heldout_ppl_fp16_weights"]:.2f}

| step | loss | loss EMA |
|---|---|---|
{hist}

Versions: Python {s["python"]}, torch {s["torch"]}, transformers {s["transformers"]},
tokenizers {s["tokenizers"]}.

## Reproduce

```bash
{_cmd(args)}
```

The file split, tokenizer and data files are deterministic. The weights are
not bit-reproducible across machines: besides CPU floating-point reduction
order, the cosine schedule is re-planned every 25 steps from the measured step
time so that training fits in `--minutes` (it can shrink or grow, up to
`--steps`), so a loaded/shared machine runs fewer steps (this run: {s["steps"]}).
For a machine-independent schedule pass a fixed `--steps` and a generous
`--minutes`, e.g. `--steps {s["steps"]} --minutes 600`.

## Sample greedy generations (48 new tokens)

Greedy decoding of a model this small falls into repetition loops quickly.
Prompts ending in a space (`"def "`) tokenize to a lone-space token, which the
GPT-2-style pre-tokenizer only produces before another space (e.g. before an
inline `  # comment`), so such prompts give worse continuations than `"def"`.

{sample_md}

## License

Trained from scratch by this project on CPython's standard library sources,
which are distributed under the Python Software Foundation License
(PSF-2.0); see https://docs.python.org/3/license.html. No other data or
pretrained weights were used.
"""
    (out_dir / "README.md").write_text(card, encoding="utf-8")


def write_data_readme(data_dir: Path, s, held_files, calib_files, held_text, calib_text, args) -> None:
    def sha(t):
        return hashlib.sha256(t.encode("utf-8")).hexdigest()

    held_row = (
        "| `heldout/stdlib_heldout.txt` | held-out files, for perplexity evaluation (fp vs. quantized) | "
        f"{len(held_text.encode()) / 1024:.0f} KiB | {len(held_files)} | `{sha(held_text)[:16]}…` |"
    )
    calib_row = (
        "| `calibration/stdlib_calib.txt` | **training-split** files, for PTQ calibration (disjoint from held-out) | "
        f"{len(calib_text.encode()) / 1024:.0f} KiB | {len(calib_files)} | `{sha(calib_text)[:16]}…` |"
    )
    text = f"""# data/

Small text corpora used with the embedded default model
(`models/tiny-stdlib-llama`). Both are generated by
`scripts/train_default_model.py` (command: `{_cmd(args)}`) from the `.py`
sources of the CPython {s["python"]} standard library (PSF license).

Files are split by `sha256(path relative to the stdlib dir)`: ~{HELDOUT_PERCENT} % go to
the held-out split and are never seen in tokenizer or model training; the rest
form the training split. Within each file below, source files are concatenated
in path order, each preceded by a 3-line header:

```
{SEPARATOR}
# file: <relative/path.py>
{SEPARATOR}
```

| file | what | size | files | sha256 |
|---|---|---|---|---|
{held_row}
{calib_row}

Reference numbers (fp32 evaluation, non-overlapping {SEQ_LEN}-token windows over
the whole `stdlib_heldout.txt`, a `<|bos|>` token prepended once):
held-out perplexity {s["heldout_ppl"]:.2f} with the trained fp32 weights,
{s["heldout_ppl_fp16_weights"]:.2f} with the committed float16 weights.

Held-out files: {", ".join(f"`{f}`" for f in held_files)}

Calibration files: {", ".join(f"`{f}`" for f in calib_files)}
"""
    (data_dir / "README.md").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
