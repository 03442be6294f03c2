#!/usr/bin/env python3
"""Train Medusa heads for the embedded default model (``models/tiny-stdlib-llama``), Medusa-1 style.

K heads read the frozen base model's last hidden state x (after the final norm, what its lm_head reads):
x_0 = x; x_{l+1} = x_l + SiLU(W_l x_l + b_l) for L residual layers, then logits = W_lm x_L. The base lm_head
at position t predicts token t+1; head h predicts token t+2+h. Every head's lm_head starts as the base lm_head
and its residual layers at zero, so before training each head guesses what the base model would say next.

Loss, per head, weighted 0.8^h: (1 - w) x cross-entropy against token t+2+h + w x KL(base || head) against the
base model's distribution at position t+1+h (its prediction of the same token; --distill-weight w). A fraction
of every batch (--self-distill) is the base model's own greedy continuations of training-split prompts: under
greedy speculation the heads guess text the model itself writes, so that is where their accuracy counts.

Outputs, in ``--out``, the layout TensorRT-LLM's Medusa conversion reads (FasterDecoding Medusa's):
``medusa_lm_head.safetensors`` (float16, ``{h}.{l}.linear.weight|bias`` and ``{h}.{L}.weight``),
``config.json`` (sizes and the recommended ``medusa_choices`` tree), ``training_stats.json`` (data split,
steps, time, per-head top-k accuracies on held-out text and on the model's greedy continuations, the trees
for several node budgets with their expected tokens per step) and ``README.md``.

Usage::

    .venv/bin/python scripts/train_medusa_heads.py --out models/tiny-stdlib-llama-medusa --threads 1
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import medusa_heads_card
import search_medusa_tree
import torch
import torch.nn.functional as F
import train_default_model as recipe
import train_draft_model
from safetensors.torch import save_file

HEADS_FILE = "medusa_lm_head.safetensors"
MAX_RANK = 10  # top-k accuracies are measured for k = 1..MAX_RANK; a rank of MAX_RANK means "not in the top 10"
HEAD_WEIGHT_DECAY = 0.8  # Medusa's per-head loss weight: head h counts 0.8^h
PROMPT_LEN = 64
EARLY_POSITIONS = 64
EVAL_WINDOWS = 24  # 24 x 256 tokens of held-out text, as the draft's agreement is measured


class MedusaHeads(torch.nn.Module):
    def __init__(self, num_heads: int, num_layers: int, base_lm_head: torch.Tensor):
        super().__init__()
        vocab, hidden = base_lm_head.shape
        self.num_layers = num_layers
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(num_layers)) for _ in range(num_heads))
        self.lm_heads = torch.nn.ModuleList(torch.nn.Linear(hidden, vocab, bias=False) for _ in range(num_heads))
        with torch.no_grad():
            for head, lm_head in zip(self.blocks, self.lm_heads):
                for layer in head:
                    layer.weight.zero_()
                    layer.bias.zero_()
                lm_head.weight.copy_(base_lm_head)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [K, ..., V] of every head on hidden states [..., H]."""
        outputs = []
        for head, lm_head in zip(self.blocks, self.lm_heads):
            x = hidden
            for layer in head:
                x = x + F.silu(layer(x))
            outputs.append(lm_head(x))
        return torch.stack(outputs)

    def contract_state(self) -> dict[str, torch.Tensor]:
        """The weights under the Medusa checkpoint's names, float16."""
        state = {}
        for h, (head, lm_head) in enumerate(zip(self.blocks, self.lm_heads)):
            for index, layer in enumerate(head):
                state[f"{h}.{index}.linear.weight"] = layer.weight.detach().half().contiguous()
                state[f"{h}.{index}.linear.bias"] = layer.bias.detach().half().contiguous()
            state[f"{h}.{self.num_layers}.weight"] = lm_head.weight.detach().half().contiguous()
        return state


def backbone(base, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen base model's last hidden states (after the final norm) and its logits."""
    with torch.no_grad():
        hidden = base.model(input_ids=ids).last_hidden_state
        return hidden, base.lm_head(hidden)


def heads_loss(heads: MedusaHeads, base, ids: torch.Tensor, distill_weight: float) -> tuple[torch.Tensor, list[float]]:
    hidden, base_logits = backbone(base, ids)
    logits = heads(hidden)
    length = ids.shape[1]
    total, per_head = 0.0, []
    for h in range(logits.shape[0]):
        span = length - 2 - h  # positions t whose target t+2+h is in the window
        log_q = F.log_softmax(logits[h, :, :span], dim=-1)
        ce = F.nll_loss(log_q.reshape(-1, log_q.shape[-1]), ids[:, 2 + h :].reshape(-1))
        teacher = F.log_softmax(base_logits[:, 1 + h : 1 + h + span], dim=-1)
        kl = F.kl_div(log_q, teacher, log_target=True, reduction="none").sum(-1).mean()
        loss = (1 - distill_weight) * ce + distill_weight * kl
        total = total + HEAD_WEIGHT_DECAY**h * loss
        per_head.append(loss.item())
    return total, per_head


def true_token_ranks(heads: MedusaHeads, base, windows: torch.Tensor, first: int = 0) -> torch.Tensor:
    """[positions, K]: per position t >= `first` whose targets t+2..t+1+K all lie in its window, the rank of
    token t+2+h among head h's logits (0 = its top guess), capped at MAX_RANK."""
    num_heads = len(heads.lm_heads)
    rows = []
    with torch.no_grad():
        for batch in windows.split(8):
            hidden, _ = backbone(base, batch)
            last = batch.shape[1] - 2 - num_heads  # the last position with every head's target in the window
            logits = heads(hidden[:, first : last + 1])
            per_head = []
            for h in range(num_heads):
                target = batch[:, first + 2 + h : last + 3 + h]
                right = logits[h].gather(-1, target.unsqueeze(-1))
                per_head.append((logits[h] > right).sum(-1).clamp(max=MAX_RANK).reshape(-1))
            rows.append(torch.stack(per_head, dim=-1))
    return torch.cat(rows)


def topk_accuracies(ranks: torch.Tensor) -> list[list[float]]:
    """Per head, the top-k accuracy for k = 1..MAX_RANK."""
    return [[round(float((ranks[:, h] < k).float().mean()), 4) for k in range(1, MAX_RANK + 1)] for h in range(ranks.shape[1])]


def head0_top1_on_windows(heads: MedusaHeads, base, windows: torch.Tensor) -> tuple[float, int]:
    """Head 0's top-1 accuracy over every position t with a token t+2 in its window (the shipped file's check)."""
    with torch.no_grad():
        hidden, _ = backbone(base, windows)
        guesses = heads(hidden[:, :-2])[0].argmax(-1)
    right = guesses == windows[:, 2:]
    return float(right.float().mean()), right.numel()


def trees_for_budgets(accuracy: dict[str, list], ranks: dict[str, torch.Tensor], windows: int, budgets: list[int]) -> dict[str, dict]:
    """Per node budget, the tree built from the greedy-continuation accuracies, its estimated tokens per step, the
    tokens per step measured at every position of each evaluation set, and those of greedy Medusa decoding along
    the `windows` continuations (the positions a decode visits; all of each, and its first 64 new tokens)."""
    rank_probs = search_medusa_tree.rank_accuracies(accuracy["greedy_continuations"])
    measured_on = {name: [tuple(row) for row in true_ranks.tolist()] for name, true_ranks in ranks.items()}
    continuations = ranks["greedy_continuations"]
    sequences = [[tuple(row) for row in window] for window in continuations.reshape(windows, -1, continuations.shape[-1]).tolist()]
    trees = {}
    for budget in budgets:
        tree = search_medusa_tree.build_tree(rank_probs, budget)
        trees[str(budget)] = dict(
            expected_tokens_per_step=round(search_medusa_tree.expected_tokens_per_step(tree, rank_probs), 3),
            measured_tokens_per_step={name: round(search_medusa_tree.measured_tokens_per_step(tree, rows), 3) for name, rows in measured_on.items()},
            decoded_tokens_per_step=dict(
                greedy_continuations=round(search_medusa_tree.decoded_tokens_per_step(tree, sequences), 3),
                greedy_continuations_64_new_tokens=round(search_medusa_tree.decoded_tokens_per_step(tree, sequences, max_tokens=EARLY_POSITIONS), 3),
            ),
            depth=max(len(node) for node in tree),
            medusa_choices=tree,
        )
    return trees


def training_windows(args, train_stream: torch.Tensor, gen: torch.Generator, generated, own: int) -> torch.Tensor:
    starts = torch.randint(0, len(train_stream) - recipe.SEQ_LEN, (args.batch - own,), generator=gen).tolist()
    windows = [train_stream[s : s + recipe.SEQ_LEN] for s in starts]
    if own:
        windows += list(generated[torch.randint(0, len(generated), (own,), generator=gen), : recipe.SEQ_LEN])
    return torch.stack(windows)


def train(args, heads: MedusaHeads, base, train_stream: torch.Tensor, generated, own: int) -> tuple[int, float, list[float]]:
    params = list(heads.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(recipe.SEED)
    step, started, losses = 0, time.time(), []
    while step < args.steps and time.time() - started < args.minutes * 60:
        for group in opt.param_groups:
            group["lr"] = recipe.lr_at(step, args.steps, args.lr, args.warmup)
        loss, losses = heads_loss(heads, base, training_windows(args, train_stream, gen, generated, own), args.distill_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % args.log_every == 0:
            recipe.log(f"step {step} loss {loss.item():.4f} per head " + " ".join(f"{value:.3f}" for value in losses))
    return step, (time.time() - started) / 60, losses


def evaluate(heads: MedusaHeads, base, held_stream: torch.Tensor, continuations: torch.Tensor) -> dict[str, torch.Tensor]:
    seq_len = recipe.SEQ_LEN
    count = min(EVAL_WINDOWS, (len(held_stream) - 1) // seq_len)
    held_windows = torch.stack([held_stream[i * seq_len : (i + 1) * seq_len] for i in range(count)])
    greedy = true_token_ranks(heads, base, continuations, first=PROMPT_LEN - 1)
    per_window = greedy.reshape(len(continuations), -1, greedy.shape[-1])
    return {
        "heldout_text": true_token_ranks(heads, base, held_windows),
        "greedy_continuations": greedy,
        # the first tokens a short request generates, before a tiny model's greedy text falls into loops
        "greedy_continuations_first_64": per_window[:, :EARLY_POSITIONS].reshape(-1, greedy.shape[-1]),
    }


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="models/tiny-stdlib-llama", help="the trained base model (kept frozen)")
    ap.add_argument("--out", default="models/tiny-stdlib-llama-medusa")
    ap.add_argument("--data-out", default="data", help="where the held-out split lies (heldout/stdlib_heldout.txt)")
    ap.add_argument("--stdlib", default=None, help="override the stdlib dir (default: base interpreter's)")
    ap.add_argument("--heads", type=int, default=4, help="number of Medusa heads K")
    ap.add_argument("--layers", type=int, default=1, help="residual layers per head L")
    ap.add_argument("--steps", type=int, default=500, help="max optimizer steps (the learning-rate schedule's length)")
    ap.add_argument("--minutes", type=float, default=11.0, help="wall-clock budget for the training loop")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--distill-weight", type=float, default=0.5, help="weight of KL(base || head) against the CE on the true token")
    ap.add_argument("--self-distill", type=float, default=0.75, help="fraction of each batch from the base model's greedy continuations")
    ap.add_argument("--generated", type=int, default=1024, help="greedy continuations to generate (--self-distill)")
    ap.add_argument("--budgets", default="4,8,16,32,63", help="node budgets of the trees written to training_stats.json")
    ap.add_argument("--recommend", type=int, default=8, help="the budget whose tree goes to config.json as medusa_choices")
    ap.add_argument("--log-every", type=int, default=25)
    args = ap.parse_args(argv)
    args.budget_list = [int(value) for value in args.budgets.split(",")]
    if args.recommend not in args.budget_list:
        raise SystemExit(f"--recommend {args.recommend} must be one of --budgets {args.budgets}")
    for name in ("distill_weight", "self_distill"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise SystemExit(f"--{name.replace('_', '-')} must be a fraction from 0 to 1, got {getattr(args, name):g}")
    if args.heads < 1 or args.layers < 0:
        raise SystemExit(f"--heads must be >= 1 and --layers >= 0, got {args.heads} and {args.layers}")
    return args


def main(argv=None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(recipe.SEED)
    started = time.time()
    base_dir, out_dir = Path(args.base), Path(args.out)
    tok = AutoTokenizer.from_pretrained(str(base_dir), local_files_only=True)
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), local_files_only=True, dtype=torch.float32).eval()
    base.requires_grad_(False)
    heads = MedusaHeads(args.heads, args.layers, base.lm_head.weight.detach())

    stdlib = Path(args.stdlib).resolve() if args.stdlib else recipe.base_stdlib_dir()
    train_docs, _ = recipe.collect_corpus(stdlib)
    train_stream = recipe.encode_docs(tok, train_docs)
    held_stream = train_draft_model.heldout_stream(tok, Path(args.data_out), recipe.BOS_ID)
    continuations = train_draft_model.target_continuations(base, held_stream, 32, recipe.SEQ_LEN, PROMPT_LEN, recipe.SEED)
    before = evaluate(heads, base, held_stream, continuations)
    own = round(args.batch * args.self_distill)
    generated = None
    if own:
        generated = train_draft_model.target_continuations(base, train_stream, args.generated, recipe.SEQ_LEN, PROMPT_LEN, recipe.SEED)
        recipe.log(f"{len(generated)} greedy continuations of the base model generated ({own} of {args.batch} per batch)")

    steps, train_minutes, last_losses = train(args, heads, base, train_stream, generated, own)
    state = heads.contract_state()
    load_contract_state(heads, state)  # measure the float16 weights that are shipped
    after = evaluate(heads, base, held_stream, continuations)
    check_windows = torch.stack([held_stream[i * recipe.SEQ_LEN : (i + 1) * recipe.SEQ_LEN] for i in range(4)])
    check_top1, check_positions = head0_top1_on_windows(heads, base, check_windows)

    accuracy = {name: topk_accuracies(ranks) for name, ranks in after.items()}
    trees = trees_for_budgets(accuracy, after, len(continuations), args.budget_list)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out_dir / HEADS_FILE))
    vocab, hidden = base.lm_head.weight.shape
    config = {
        "medusa_num_heads": args.heads,
        "medusa_num_layers": args.layers,
        "hidden_size": hidden,
        "vocab_size": vocab,
        "medusa_hidden_act": "silu",
        "base_model_name_or_path": base_dir.name,
        "medusa_choices": trees[str(args.recommend)]["medusa_choices"],
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    stats = dict(
        base_model=str(base_dir),
        num_heads=args.heads,
        num_layers=args.layers,
        trainable_params=sum(p.numel() for p in heads.parameters()),
        steps=steps,
        train_minutes=round(train_minutes, 2),
        total_minutes=round((time.time() - started) / 60, 2),
        last_batch_loss_per_head=[round(value, 4) for value in last_losses],
        data=dict(
            training="the default model's training split (train_default_model.collect_corpus of the stdlib: "
            f"{len(train_docs)} files, {len(train_stream):,} tokens), windows of {recipe.SEQ_LEN} tokens; "
            f"{own} of {args.batch} per batch from {args.generated} greedy continuations of {PROMPT_LEN}-token prompts",
            heldout="data/heldout/stdlib_heldout.txt",
            heldout_text_positions=len(after["heldout_text"]),
            greedy_continuation_positions=len(after["greedy_continuations"]),
            greedy_continuations=f"32 held-out prompts of {PROMPT_LEN} tokens continued greedily to {recipe.SEQ_LEN + 1} tokens; "
            "positions whose base token and every head's target are generated; _first_64: the first 64 such positions of each",
        ),
        topk_accuracy_before={name: topk_accuracies(ranks) for name, ranks in before.items()},
        topk_accuracy=accuracy,
        trees=trees,
        recommended_budget=args.recommend,
        check=dict(
            windows=4,
            seq_len=recipe.SEQ_LEN,
            positions=check_positions,
            head0_top1=round(check_top1, 4),
            what="head 0's top-1 accuracy over every position t with a token t+2 in the first 4 held-out windows",
        ),
        safetensors_bytes=(out_dir / HEADS_FILE).stat().st_size,
        torch=torch.__version__,
        python=platform.python_version(),
        command=".venv/bin/python scripts/train_medusa_heads.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
    )
    (out_dir / "training_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    (out_dir / "README.md").write_text(medusa_heads_card.model_card(stats, out_dir.name))
    recipe.log("stats: " + json.dumps({key: value for key, value in stats.items() if key != "trees"}))
    return stats


def load_contract_state(heads: MedusaHeads, state: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for h, (head, lm_head) in enumerate(zip(heads.blocks, heads.lm_heads)):
            for index, layer in enumerate(head):
                layer.weight.copy_(state[f"{h}.{index}.linear.weight"].float())
                layer.bias.copy_(state[f"{h}.{index}.linear.bias"].float())
            lm_head.weight.copy_(state[f"{h}.{heads.num_layers}.weight"].float())


if __name__ == "__main__":
    main()
