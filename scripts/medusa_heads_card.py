"""README.md of trained Medusa heads, written from their training_stats.json by scripts/train_medusa_heads.py."""

from __future__ import annotations

from refengine.speculative.medusa_tree import format_medusa_choices


def _accuracy_rows(stats: dict, where: str) -> list[str]:
    before, after = stats["topk_accuracy_before"][where], stats["topk_accuracy"][where]
    return [f"| head {h} (token t+{2 + h}) | {before[h][0]:.3f} | **{after[h][0]:.3f}** | {after[h][2]:.3f} | {after[h][9]:.3f} |" for h in range(len(after))]


def _tree_rows(stats: dict) -> list[str]:
    rows = []
    for budget, tree in stats["trees"].items():
        measured, decoded = tree["measured_tokens_per_step"], tree["decoded_tokens_per_step"]
        rows.append(
            f"| {budget}{' (recommended)' if int(budget) == stats['recommended_budget'] else ''} | {tree['depth']} "
            f"| {tree['expected_tokens_per_step']:.2f} | {measured['greedy_continuations']:.2f} "
            f"| {measured['greedy_continuations_first_64']:.2f} | {measured['heldout_text']:.2f} "
            f"| {decoded['greedy_continuations_64_new_tokens']:.2f} | {decoded['greedy_continuations']:.2f} |"
        )
    return rows


def model_card(stats: dict, title: str) -> str:
    heads, layers = stats["num_heads"], stats["num_layers"]
    recommended = stats["trees"][str(stats["recommended_budget"])]["medusa_choices"]
    data = stats["data"]
    table_head = ["| | top-1 before training | top-1 | top-3 | top-10 |", "|---|---:|---:|---:|---:|"]
    lines = [
        f"# {title}",
        "",
        f"{heads} Medusa heads of `../{stats['base_model'].split('/')[-1]}` (Medusa-1: the base model frozen), "
        f"{layers} residual layer each, {stats['trainable_params']:,} parameters in float16 "
        f"({stats['safetensors_bytes'] / 1e6:.1f} MB). Head h reads the base model's last hidden state at position t "
        "(after the final norm) and guesses token t+2+h; the base model's own lm_head guesses t+1.",
        "",
        "Layout (FasterDecoding Medusa's, which TensorRT-LLM's Medusa checkpoint conversion reads): "
        "`medusa_lm_head.safetensors` holds `{h}.{l}.linear.weight` [H, H] and `{h}.{l}.linear.bias` [H] for each "
        f"residual layer l < {layers}, and `{{h}}.{layers}.weight` [V, H], the head's lm_head; `config.json` gives "
        "the sizes and `medusa_choices`, the recommended tree.",
        "",
        f"Trained {stats['steps']:,} steps ({stats['train_minutes']:.1f} min of training, {stats['total_minutes']:.1f} min "
        f"for the whole script, on a CPU with the command below) on {data['training']}. Each head's lm_head started "
        "as the base lm_head, its residual layer at zero; the loss is 0.8^h-weighted cross-entropy on the true token "
        "mixed with KL towards the base model's distribution for the same token.",
        "",
        f"Accuracy on the base model's greedy continuations of held-out prompts ({data['greedy_continuation_positions']:,} "
        "positions; under greedy speculation this is the acceptance that counts):",
        "",
        *table_head,
        *_accuracy_rows(stats, "greedy_continuations"),
        "",
        f"On held-out text (`{data['heldout']}`, {data['heldout_text_positions']:,} positions):",
        "",
        *table_head,
        *_accuracy_rows(stats, "heldout_text"),
        "",
        "Trees (`medusa_choices`) built from the greedy-continuation accuracies by Medusa's sparse-tree construction "
        "(`scripts/search_medusa_tree.py`): tokens per step = 1 + expected accepted draft tokens, estimated as the product of "
        "the heads' rank accuracies; measured at every position (teacher-forced) of the same continuations, of their "
        "first 64 generated tokens (before a tiny model's greedy text falls into loops) and of held-out text; and "
        "decoded: greedy Medusa decoding walked along the continuations (only the positions a decode visits), for 64 "
        "new tokens and for the whole continuation:",
        "",
        "| nodes | depth | estimated tokens/step | every position: continuations | their first 64 tokens | held-out text "
        "| decoded: 64 new tokens | whole continuation |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        *_tree_rows(stats),
        "",
        f"The recommended tree (`medusa_choices` in `config.json`) has {stats['recommended_budget']} nodes: every node is "
        "one more position the base model verifies per step, which a GPU does for nearly nothing up to ~64 nodes but a "
        'CPU pays for (see docs/decoding.md, "The shipped Medusa heads"). As Triton\'s `medusa_choices` parameter:',
        "",
        "```text",
        format_medusa_choices(recommended),
        "```",
        "",
        "Reproduce:",
        "",
        "```bash",
        stats["command"],
        "```",
        "",
        "Figures: `training_stats.json`. License: as the base model (trained on CPython's PSF-licensed sources).",
        "",
    ]
    return "\n".join(lines)
