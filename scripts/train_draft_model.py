"""The `--draft-of` mode of `train_default_model.py`: a small draft model for speculative decoding.

The draft shares the target's tokenizer (copied, not retrained) and its vocabulary. It starts
from the target's own weights where the shapes allow (embeddings, the first `--draft-layers`
decoder layers, the final norm, lm_head) and is then trained on the same training split with a
mix of next-token cross-entropy and KL(target || draft) on the target's logits (distillation):
what speculation needs is that the draft agrees with the target, not that it models the text
on its own. Greedy agreement with the target on held-out text is reported (the expected
draft-token acceptance rate of greedy speculative decoding).

``--self-distill F`` makes a fraction F of every batch the target's own greedy continuations of
training-split prompts (generated once, before training): under speculation the draft mostly
continues text the target wrote, so that is where agreement counts. ``--draft-init DIR`` starts
from an earlier draft instead of the target's weights (a second training stage); its
``training_stats.json`` is kept under ``previous_stage``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def _draft_model(target, num_layers: int, intermediate: int | None):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = target.config.to_dict()
    config["num_hidden_layers"] = num_layers
    if intermediate is not None:
        config["intermediate_size"] = intermediate
    draft = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in config.items() if k not in ("architectures",)}))
    target_state = target.state_dict()
    copied = 0
    for name, tensor in draft.state_dict().items():
        source = target_state.get(name)
        if source is not None and source.shape == tensor.shape:
            tensor.copy_(source)
            copied += 1
    return draft.float(), copied


def _initial_draft(args, target):
    if not args.draft_init:
        return _draft_model(target, args.draft_layers, args.draft_intermediate)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(args.draft_init, local_files_only=True, dtype=torch.float32), 0


def heldout_stream(tok, data_dir: Path, bos_id: int) -> torch.Tensor:
    """The held-out split (``<data-out>/heldout/stdlib_heldout.txt``) as one token stream after a BOS."""
    text = (data_dir / "heldout" / "stdlib_heldout.txt").read_text(encoding="utf-8")
    return torch.tensor([bos_id] + tok.backend_tokenizer.encode(text, add_special_tokens=False).ids)


def target_continuations(target, stream, count: int, seq_len: int, prompt_len: int, seed: int) -> torch.Tensor:
    """`count` windows of `seq_len` tokens: a training-text prompt, then the target's greedy continuation."""
    gen = torch.Generator().manual_seed(seed + 1)
    starts = torch.randint(0, len(stream) - prompt_len, (count,), generator=gen).tolist()
    windows = []
    with torch.no_grad():
        for first in range(0, count, 16):
            prompts = torch.stack([stream[s : s + prompt_len] for s in starts[first : first + 16]])
            out = target.generate(
                input_ids=prompts,
                attention_mask=torch.ones_like(prompts),
                do_sample=False,
                max_new_tokens=seq_len + 1 - prompt_len,
                min_new_tokens=seq_len + 1 - prompt_len,
            )
            windows.extend(out[:, : seq_len + 1])
    return torch.stack(windows)


def greedy_agreement(draft, target, stream, seq_len: int, max_windows: int = 24) -> float:
    """Fraction of positions where draft and target pick the same next token (teacher-forced)."""
    agree = total = 0
    with torch.no_grad():
        for index in range(min(max_windows, (len(stream) - 1) // seq_len)):
            x = stream[index * seq_len : (index + 1) * seq_len].unsqueeze(0)
            same = draft(input_ids=x).logits.argmax(-1) == target(input_ids=x).logits.argmax(-1)
            agree += int(same.sum())
            total += same.numel()
    return agree / max(total, 1)


def train_draft(args, recipe) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(recipe.SEED)
    started = time.time()
    target_dir, out_dir = Path(args.draft_of), Path(args.out)
    if out_dir.resolve() == target_dir.resolve():
        raise SystemExit("--out must differ from --draft-of")
    if not 0.0 <= args.self_distill <= 1.0:
        raise SystemExit(f"--self-distill must be a fraction from 0 to 1, got {args.self_distill:g}")
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(target_dir), local_files_only=True)
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), local_files_only=True, dtype=torch.float32).eval()
    previous = Path(args.draft_init, "training_stats.json") if args.draft_init else None
    previous_stats = json.loads(previous.read_text()) if previous and previous.is_file() else None
    draft, copied = _initial_draft(args, target)
    num_params = sum(p.numel() for p in draft.parameters())
    recipe.log(f"draft: {draft.config.num_hidden_layers} layer(s), {num_params:,} params, {copied} tensors from the target")

    stdlib = Path(args.stdlib).resolve() if args.stdlib else recipe.base_stdlib_dir()
    train_docs, _ = recipe.collect_corpus(stdlib)
    train_stream = recipe.encode_docs(tok, train_docs)
    held_stream = heldout_stream(tok, Path(args.data_out), recipe.BOS_ID)
    seq_len = recipe.SEQ_LEN
    before = greedy_agreement(draft, target, held_stream, seq_len)
    held_own = target_continuations(target, held_stream, 32, seq_len, 64, recipe.SEED)[:, :seq_len].reshape(-1)
    own_before = greedy_agreement(draft, target, held_own, seq_len)
    recipe.log(f"greedy agreement with the target on held-out text before training: {before:.3f}, on its continuations of held-out prompts: {own_before:.3f}")

    decay = [p for p in draft.parameters() if p.dim() >= 2]
    no_decay = [p for p in draft.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    generated = None
    own = round(args.batch * args.self_distill)
    if own:
        generated = target_continuations(target, train_stream, args.generated, seq_len, 64, recipe.SEED)
        recipe.log(f"{len(generated)} greedy continuations of the target generated ({own} of {args.batch} per batch)")
    gen = torch.Generator().manual_seed(recipe.SEED)
    max_start = len(train_stream) - seq_len - 1
    budget_s, step, ema = args.minutes * 60.0, 0, None
    draft.train()
    loop_start = time.time()
    while step < args.steps and time.time() - loop_start < budget_s:
        for group in opt.param_groups:
            group["lr"] = recipe.lr_at(step, args.steps, args.lr, args.warmup)
        starts = torch.randint(0, max_start, (args.batch,), generator=gen).tolist()
        windows = [train_stream[s : s + seq_len + 1] for s in starts[: args.batch - own]]
        if own:
            windows += list(generated[torch.randint(0, len(generated), (own,), generator=gen)])
        batch = torch.stack(windows)
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.no_grad():
            teacher = F.log_softmax(target(input_ids=x).logits, dim=-1)
        logits = draft(input_ids=x).logits
        log_q = F.log_softmax(logits, dim=-1)
        ce = F.nll_loss(log_q.reshape(-1, log_q.size(-1)), y.reshape(-1))
        kl = F.kl_div(log_q, teacher, log_target=True, reduction="none").sum(-1).mean()
        loss = (1 - args.distill_weight) * ce + args.distill_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
        ema = loss.item() if ema is None else 0.9 * ema + 0.1 * loss.item()
        if step % args.log_every == 0:
            recipe.log(f"step {step} loss {loss.item():.4f} (ema {ema:.4f}) ce {ce.item():.3f} kl {kl.item():.3f}")
    train_minutes = (time.time() - loop_start) / 60
    draft.eval()
    after = greedy_agreement(draft, target, held_stream, seq_len)
    own_after = greedy_agreement(draft, target, held_own, seq_len)
    recipe.log(f"greedy agreement on the target's held-out continuations after training: {own_after:.3f}")
    held_nll, held_ppl, _ = recipe.eval_ppl(draft, held_stream)
    recipe.log(f"greedy agreement after {step} steps: {after:.3f}; held-out ppl {held_ppl:.2f}")

    draft = draft.to(torch.float16)
    draft.config.dtype = torch.float16
    draft.generation_config.bos_token_id = recipe.BOS_ID
    draft.generation_config.eos_token_id = recipe.EOS_ID
    draft.generation_config.pad_token_id = recipe.PAD_ID
    draft.save_pretrained(str(out_dir), safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(target_dir / name, out_dir / name)
    recipe.patch_compat(out_dir)
    stats = dict(
        draft_of=str(target_dir),
        layers=draft.config.num_hidden_layers,
        params=num_params,
        steps=step,
        train_minutes=round(train_minutes, 2),
        total_minutes=round((time.time() - started) / 60, 2),
        greedy_agreement_before=round(before, 4),
        greedy_agreement_after=round(after, 4),
        continuation_agreement_before=round(own_before, 4),
        continuation_agreement_after=round(own_after, 4),
        heldout_ppl=round(held_ppl, 3),
        heldout_nll=round(held_nll, 4),
        safetensors_bytes=(out_dir / "model.safetensors").stat().st_size,
        command=(
            f".venv/bin/python scripts/train_default_model.py --draft-of {args.draft_of} --out {args.out} "
            f"--draft-layers {args.draft_layers} --steps {args.steps} --minutes {args.minutes:g} "
            f"--batch {args.batch} --lr {args.lr:g} --warmup {args.warmup} --threads {args.threads}"
            + (f" --self-distill {args.self_distill:g} --generated {args.generated}" if own else "")
            + (f" --draft-init {args.draft_init}" if args.draft_init else "")
        ),
    )
    if previous_stats:
        stats["previous_stage"] = previous_stats
    (out_dir / "training_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    for path in out_dir.iterdir():
        path.chmod(0o644)
    recipe.log("stats: " + json.dumps(stats))
    return stats
