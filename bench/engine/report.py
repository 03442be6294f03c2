"""Markdown tables of an engine-benchmark result (for BENCHMARKS.md and terminal output)."""

from __future__ import annotations

from typing import Any

LABELS = {
    "refengine_inflight": "(a) refengine, inflight batching",
    "refengine_static": "(b) refengine, static batching (held batches of B)",
    "hf_static_generate": "(c) transformers `generate`, left-padded batches of B",
    "hf_continuous_batching": "(d) transformers continuous batching",
}
RATIO_KEYS = {"refengine_static": "inflight_vs_static", "hf_static_generate": "inflight_vs_hf_static", "hf_continuous_batching": "inflight_vs_hf_continuous"}


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render_markdown(result: dict[str, Any]) -> str:
    lines = _header(result) + _systems_table(result) + _kv_table(result["kv_utilisation"])
    lines += _prefix_table(result["prefix_reuse"]) + _targets_table(result["targets"])
    return "\n".join(lines) + "\n"


def _header(result: dict[str, Any]) -> list[str]:
    machine, config, workload = result["machine"], result["engine_config"], result["workload"]
    return [
        f"Run {result['date']} · {machine['cpu']}, {machine['cpu_count']} CPU cores (shared), "
        f"torch {machine['torch']} ({machine['torch_threads']} thread), transformers {machine['transformers']}, "
        f"Python {machine['python']} · 1-min load average at the end: {machine['load_average_1min_at_end']}",
        "",
        f"Recipe: `{result['recipe']['call']}`  ",
        f"Timing: {result['recipe']['timing']}.  ",
        f"Engine: max_batch_size {config['max_batch_size']}, max_num_tokens {config['max_num_tokens']}, "
        f"max_seq_len {config['max_seq_len']}, tokens_per_block {config['tokens_per_block']}, "
        f"{config['num_kv_blocks']} KV blocks, {config['scheduler_policy']}, chunked context "
        f"{'on' if config['enable_chunked_context'] else 'off'}, {config['compute_dtype']}; B = {result['batch_size']}.  ",
        f"Workload: {workload['num_requests']} requests, prompts {workload['prompt_len_range'][0]}–"
        f"{workload['prompt_len_range'][1]} random tokens ({workload['prompt_tokens']['total']} in all), outputs "
        f"{workload['output_len_distribution']}: {workload['output_tokens']['total']} tokens, mean "
        f"{workload['output_tokens']['mean']}, p50 {workload['output_tokens']['p50']}, p90 "
        f"{workload['output_tokens']['p90']}, max {workload['output_tokens']['max']}; no end id.",
        "",
    ]


def _systems_table(result: dict[str, Any]) -> list[str]:
    ratios, agreement = result["ratios"], result["agreement_with_refengine_inflight"]
    lines = [
        "| system | useful tok/s (wall) | wall s | useful tok/s (CPU time) | CPU s | engine steps | "
        "(a) / this, wall | (a) / this, CPU time | outputs identical to (a) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, label in LABELS.items():
        f = result["systems"][name]
        key = RATIO_KEYS.get(name)
        same = agreement.get(name)
        identical = f"{same['identical_outputs']}/{same['requests']}" if same else "–"
        lines.append(
            f"| {label} | {_num(f['tokens_per_s'], 0)} | {_num(f['wall_s'])} | {_num(f['tokens_per_cpu_s'], 0)} | "
            f"{_num(f['cpu_s'])} | {_num(f.get('engine_steps'))} | "
            f"{_num(ratios[key]) + '×' if key else '1×'} | {_num(ratios[key + '_cpu_time']) + '×' if key else '1×'} | "
            f"{identical} |"
        )
    lines += ["", "Rounds (wall s): " + "; ".join(f"{LABELS[n].split(' ')[0]} {result['systems'][n]['rounds_wall_s']}" for n in LABELS) + "."]
    static, hf_static = result["systems"]["refengine_static"], result["systems"]["hf_static_generate"]
    if "generated_tokens_incl_padding_rows" in static:
        lines.append(
            f"Useful share of the generated tokens (padding rows included): (b) "
            f"{100 * static['useful_fraction_of_generated']:.1f} % ({static['useful_output_tokens']} of "
            f"{static['generated_tokens_incl_padding_rows']}), (c) {100 * hf_static['useful_fraction_of_generated']:.1f} % "
            f"({hf_static['useful_output_tokens']} of {hf_static['generated_tokens_incl_padding_rows']}); "
            f"(b) against (a): {ratios['steps_static_over_inflight']}× the steps, "
            f"{ratios.get('generated_rows_static_over_inflight')}× the generated rows."
        )
    return lines


def _kv_table(kv: dict[str, Any]) -> list[str]:
    return [
        "",
        "| KV cache during (a), live tokens / allocated capacity | mean over steps | token-weighted |",
        "|---|---:|---:|",
        f"| paged: blocks in use × {kv['tokens_per_block']} tokens | {100 * kv['paged_mean']:.1f} % | {100 * kv['paged_token_weighted']:.1f} % |",
        f"| contiguous: max_seq_len {kv['max_seq_len']} per running request | {100 * kv['contiguous_mean']:.1f} % | "
        f"{100 * kv['contiguous_token_weighted']:.1f} % |",
    ]


def _prefix_table(prefix: dict[str, Any]) -> list[str]:
    on, off = prefix["on"], prefix["off"]
    return [
        "",
        f"Prefix reuse: {prefix['num_requests']} requests = shared {prefix['shared_prefix_len']}-token system prompt "
        f"+ own 16–64-token suffix, {prefix['output_len']} output tokens each, waves of {prefix['waves']} "
        f"({prefix['submission']}).",
        "",
        "| enable_prefix_caching | prefill tokens computed | from cache | shared prefill skipped | mean TTFT |",
        "|---|---:|---:|---:|---:|",
        f"| off | {off['prefill_tokens_computed']} | {off['prefill_tokens_from_cache']} | "
        f"{100 * off['shared_prefill_skipped_fraction']:.1f} % | {1e3 * off['ttft_mean_s']:.1f} ms |",
        f"| on | {on['prefill_tokens_computed']} | {on['prefill_tokens_from_cache']} | "
        f"{100 * on['shared_prefill_skipped_fraction']:.1f} % (max {100 * prefix['max_skippable_fraction']:.1f} %) | "
        f"{1e3 * on['ttft_mean_s']:.1f} ms ({prefix['ttft_off_over_on']}× faster) |",
    ]


def _targets_table(targets: dict[str, Any]) -> list[str]:
    lines = ["", "| target | value | met |", "|---|---:|:---:|"]
    for name, target in targets.items():
        value = target["value"]
        shown = f"{value}" + (f" (CPU time {target['value_cpu_time']})" if "value_cpu_time" in target else "")
        met = "yes" if target["met"] else "**no**"
        if "met_cpu_time" in target and target["met_cpu_time"] != target["met"]:
            met += f" (CPU time: {'yes' if target['met_cpu_time'] else 'no'})"
        lines.append(f"| {name} {target['target']} | {shown} | {met} |")
    return lines
