"""`trtllm-pipeline bench speculative CONFIG`: arguments and command of the speculative benchmark (bench.py).

What is compared: the built target without speculation, and each speculative variant asked for —
the build's own (an engine directory whose config.json carries `refengine_speculative`, i.e. a
spec with a speculative section), `--draft DIR` (a Hugging Face draft sharing the target's
tokenizer, or a CPU engine directory) and `--ngram` (prompt lookup).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.command_support import BuildCpuTarget, build_for_bench, dim_lines, status_console, write_and_print
from pipeline.errors import SpecError

RESULT_NAME = "bench-speculative.json"
HELP = "refengine tokens/s with and without speculative decoding (draft-target, n-gram) at batch 1, 4, 32"
CONFIG_HELP = "build config YAML (target cpu)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draft", type=Path, help="draft model directory (Hugging Face, same tokenizer) for draft-target speculation")
    parser.add_argument("--ngram", action="store_true", help="also measure n-gram (prompt-lookup) speculation")
    parser.add_argument(
        "--medusa",
        type=Path,
        help="a Medusa heads directory (medusa_lm_head.safetensors + config.json) for Medusa "
        "speculation; also measures the CPU cost of verifying a tree of N = 0..64 nodes",
    )
    parser.add_argument("--medusa-choices", help='the Medusa tree, TensorRT-LLM syntax ("{0}, {0, 0}, {1}"; default: the heads\' own)')
    parser.add_argument(
        "--medusa-vocab", type=int, help="also measure --medusa with the heads proposing only the first M token ids (refengine_speculative.medusa_vocab_size)"
    )
    parser.add_argument("--max-draft-len", type=int, default=4, help="draft tokens per step for --draft / --ngram (default 4)")
    parser.add_argument("--ngram-size", type=int, default=3, help="max_matching_ngram_size for --ngram (default 3)")
    parser.add_argument("--draft-vocab", type=int, help="also measure the --draft drafting only the first N token ids (refengine_speculative.draft_vocab_size)")
    parser.add_argument(
        "--fixed-draft-len",
        action="store_true",
        help="also measure each speculative variant with every "
        "request sending num_draft_tokens = --max-draft-len (a fixed draft length instead of the adaptive one)",
    )
    parser.add_argument("--batch-sizes", default="1,4,32", help="comma-separated batch sizes (default 1,4,32)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request (default 64)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="interleaved rounds over the systems: each system's best round "
        "is reported, and the median over rounds of each variant's CPU speed-up against the same round's plain run "
        "(default 1; more steadies the figures on a loaded machine)",
    )
    parser.add_argument(
        "--fp32-gemm",
        action="store_true",
        help="run every system with float32 GEMMs (EngineConfig.fp16_weight_gemm false: bit for bit F.linear) instead of fbgemm's fp16-weight GEMM",
    )
    parser.add_argument(
        "--with-fp32-gemm-plain",
        action="store_true",
        help="also measure the plain target on float32 GEMMs (plain_fp32_gemm), beside the plain target on the fp16-weight GEMM",
    )
    parser.add_argument("--quick", action="store_true", help="a small workload (seconds, for smoke tests)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    parser.add_argument("--out", type=Path, help=f"also write the JSON result here (default: <artifacts>/<name>/{RESULT_NAME})")


def _batch_sizes(text: str) -> tuple[int, ...]:
    parts = text.split(",")
    if not all(part.strip().isdigit() and int(part) > 0 for part in parts):
        raise SpecError(f"--batch-sizes takes positive integers separated by commas, got {text!r}")
    return tuple(int(part) for part in parts)


def run_speculative_command(args: argparse.Namespace, build_cpu_target: BuildCpuTarget) -> int:
    from bench.speculative.bench import SpeculativeBenchOptions, System, Variant, run_speculative_bench
    from bench.speculative.engines import draft_variant, ngram_variant, plain_variant, speculative_kind
    from bench.speculative.prompts import heldout_code_prompts
    from pipeline.calibration import load_tokenizer
    from pipeline.stages.prepare import checkpoint_dir

    batch_sizes = _batch_sizes(args.batch_sizes)  # before building: a typo should not cost a build
    if args.repeats < 1:
        raise SpecError(f"--repeats must be >= 1, got {args.repeats}")
    if args.max_draft_len < 1:
        raise SpecError(f"--max-draft-len must be >= 1, got {args.max_draft_len}")
    if args.draft is not None and not (args.draft / "config.json").is_file():
        raise SpecError(f"--draft {args.draft}: no config.json there (a Hugging Face model or CPU engine directory)")
    if args.medusa is not None and not (args.medusa / "medusa_lm_head.safetensors").is_file():
        raise SpecError(f"--medusa {args.medusa}: no medusa_lm_head.safetensors there (a Medusa heads directory)")
    if args.medusa_choices is not None and args.medusa is None:
        raise SpecError("--medusa-choices needs --medusa")
    if args.draft_vocab is not None and (args.draft is None or args.draft_vocab < 1):
        raise SpecError(f"--draft-vocab {args.draft_vocab}: needs --draft and a positive number of token ids")
    if args.medusa_vocab is not None and (args.medusa is None or args.medusa_vocab < 1):
        raise SpecError(f"--medusa-vocab {args.medusa_vocab}: needs --medusa and a positive number of token ids")
    _, store, results = build_for_bench(args, build_cpu_target, "bench speculative", "build")
    engine_dir = results["build"].ref.engine_dir
    work = store.build_dir / "bench-speculative"
    engines: dict[str, Path] = {"plain": plain_variant(engine_dir, work)}
    built = speculative_kind(engine_dir)
    if built is not None:
        engines[built] = engine_dir
    if args.draft is not None:
        engines["draft_model"] = draft_variant(engine_dir, work, args.draft.resolve(), args.max_draft_len)
    if args.draft_vocab is not None:
        name = f"draft_vocab{args.draft_vocab}"
        engines[name] = draft_variant(engine_dir, work, args.draft.resolve(), args.max_draft_len, args.draft_vocab, name=name)
    if args.ngram:
        engines["ngram"] = ngram_variant(engine_dir, work, args.max_draft_len, args.ngram_size)
    if args.medusa is not None:
        engines["medusa"] = _medusa_variant(engine_dir, work, args)
    if args.medusa_vocab is not None:
        engines[f"medusa_vocab{args.medusa_vocab}"] = _medusa_variant(engine_dir, work, args, args.medusa_vocab)
    variants: dict[str, Variant] = dict(engines)
    if args.fixed_draft_len:
        for name in [name for name in engines if name != "plain"]:
            variants[f"{name}_k{args.max_draft_len}"] = System(engines[name], args.max_draft_len)
    if args.with_fp32_gemm_plain:
        variants["plain_fp32_gemm"] = System(engines["plain"], fp16_weight_gemm=False)
    if len(variants) == 1:
        raise SpecError("bench speculative: nothing to compare; pass --draft DIR, --ngram and/or --medusa DIR (or build with a speculative section)")
    tokenizer = load_tokenizer(checkpoint_dir(results["prepare"].ref.path))
    options = SpeculativeBenchOptions(
        batch_sizes=batch_sizes,
        max_tokens=args.max_tokens,
        max_draft_len=args.max_draft_len,
        quick=args.quick,
        repeats=args.repeats,
        fp16_weight_gemm=not args.fp32_gemm,
    )
    prompts = heldout_code_prompts(lambda text: tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.bos_token_id, 8, options.prompt_tokens)
    status = status_console()
    result = run_speculative_bench(variants, prompts, options, progress=dim_lines(status))
    if args.medusa is not None:
        from bench.speculative.medusa import verification_cost

        result["medusa_verification_cost"] = verification_cost(engines["medusa"], options.fp16_weight_gemm, args.quick)
    write_and_print(result, args.out or store.build_dir / RESULT_NAME, args.json, _render, status)
    return 0


def _medusa_variant(engine_dir: Path, work: Path, args: argparse.Namespace, vocab_size: int | None = None) -> Path:
    from bench.speculative.medusa import medusa_variant
    from refengine.errors import EngineConfigError

    try:
        name = "medusa" if vocab_size is None else f"medusa_vocab{vocab_size}"
        return medusa_variant(engine_dir, work, args.medusa.resolve(), args.medusa_choices, vocab_size, name)
    except (EngineConfigError, ValueError) as error:
        raise SpecError(f"--medusa / --medusa-choices: {error}") from None


def _render(result: dict) -> str:
    from bench.speculative.bench import render_markdown
    from bench.speculative.medusa import render_cost

    text = render_markdown(result)
    for row in result["rows"]:
        for name in [name for name in result["variants"] if name.startswith("medusa")]:
            medusa = row.get(name, {})
            if "accepted_per_tree_step" in medusa:
                text += f"\n\n{name} at batch {row['batch_size']}: {medusa['accepted_per_tree_step']} accepted tokens per tree step; "
                text += "accepted per node: " + ", ".join(f"{path} {count}" for path, count in medusa["tree_node_acceptances"].items())
    cost = result.get("medusa_verification_cost")
    return text + ("" if cost is None else "\n\nMedusa: one target forward verifying N tree nodes, batch 1\n\n" + render_cost(cost))
