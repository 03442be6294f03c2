"""The LoRA benchmark (`bench.engine.lora`): a tiny run's report (shape and sanity, no timings)."""

from __future__ import annotations

import json

from bench.engine.lora import LoraBenchOptions, run_lora_bench
from refengine import write_engine_dir
from tests.refengine.conftest import write_random_checkpoint

BUILD_CONFIG = {"max_batch_size": 4, "max_input_len": 32, "max_seq_len": 64, "max_num_tokens": 128, "plugin_config": {"tokens_per_block": 8}}


def test_a_tiny_run_reports_both_sides_and_the_ratio(tmp_path) -> None:
    engine_dir = write_engine_dir(write_random_checkpoint(tmp_path / "checkpoint"), tmp_path / "engine", BUILD_CONFIG, "1.2.0")
    options = LoraBenchOptions(num_requests=8, num_adapters=4, rank=4, prompt_len=(4, 12), output_mean=4, output_cap=8, rounds=2)
    lines: list[str] = []
    result = run_lora_bench(engine_dir, options, progress=lines.append)
    json.loads(json.dumps(result))
    assert len(lines) == 4  # two rounds of each side
    base, lora = result["systems"]["base"], result["systems"]["lora"]
    assert base["useful_output_tokens"] == lora["useful_output_tokens"] == result["recipe"]["workload"]["output_tokens"]["total"]
    assert base["all_requests_ran_their_length"] and lora["all_requests_ran_their_length"]
    assert result["ratio_lora_vs_base"] == round(lora["tokens_per_s"] / base["tokens_per_s"], 3)
    assert len(result["round_ratios"]) == 2
    assert result["target"]["value"] == result["median_round_ratio"] == sum(result["round_ratios"]) / 2
    assert result["target"]["goal"] == 0.8 and result["target"]["met"] == (result["median_round_ratio"] >= 0.8)
    assert result["adapter_outputs_differ_from_base"] > 0  # the adapters are applied
    assert "attn_q" in result["recipe"]["adapters"] and "run_lora_bench(engine_dir, num_requests=8" in result["recipe"]["call"]
