"""The LoRA adapter cache's TensorRT-LLM semantics, every bad LoRA input, and the grouped per-adapter updates.

On a small hand-written Llama checkpoint (conftest's `small_checkpoint`: 2 layers, hidden 32) with random adapters in
NVIDIA's layout (`bench.engine.lora.random_adapter`): a task id with weights is loaded and kept; the id alone
finds it, or fails with TensorRT-LLM's "not found in cache" text; least recently used, unpinned adapters are evicted
within the cache's count and bytes; adapters of requests in flight are pinned, and one more than the cache holds fails
that request only. Each bad input is an `InvalidRequestError` naming it, raised before anything changes: the cache
keeps its adapters and the other requests' outputs are those of a run without the bad ones.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.engine.lora import random_adapter
from refengine import EngineConfig, InvalidRequestError, LLMEngine, LoraRequest, LoraSettings, SamplingParams
from refengine.lora.batch import LoraBatch, LoraStacks

GREEDY = SamplingParams(max_tokens=6, temperature=0)
PROMPTS = [[3, 4, 5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17]]


def make_engine(checkpoint, **lora) -> LLMEngine:
    return LLMEngine.from_checkpoint(checkpoint, EngineConfig(max_batch_size=8, tokens_per_block=4, lora=LoraSettings(**lora)))


def adapter(engine: LLMEngine, task_id: int, rank: int = 4, modules: tuple[int, ...] | None = None, seed: int | None = None) -> LoraRequest:
    cache = engine.lora_cache
    targets = {m: t for m, t in cache.targets.items() if modules is None or m in modules}
    weights, config = random_adapter(targets, cache.shape.num_layers, rank, task_id if seed is None else seed, scale=0.5)
    return LoraRequest(task_id, weights, config)


def tokens(engine: LLMEngine, lora) -> list[tuple[int, ...]]:
    return [output.outputs[0].token_ids for output in engine.generate(PROMPTS, GREEDY, lora=lora)]


def test_weights_are_loaded_and_kept_and_the_id_alone_finds_them(small_checkpoint):
    engine = make_engine(small_checkpoint)
    with_weights = tokens(engine, adapter(engine, 7))
    assert engine.lora_cache.task_ids == (7,) and engine.lora_cache.pins(7) == 0  # kept after its requests, unpinned
    assert tokens(engine, LoraRequest(7)) == with_weights != tokens(engine, None)
    assert tokens(engine, adapter(engine, 7)) == with_weights  # the same weights again: the cached adapter
    with pytest.raises(InvalidRequestError, match="LoRA task 8 not found in cache. Please send LoRA weights with request") as missing:
        engine.add_request([1, 2], GREEDY, lora=LoraRequest(8))
    assert missing.value.field == "lora_task_id"
    prefetched = make_engine(small_checkpoint)
    request = adapter(prefetched, 7)
    prefetched.load_lora_adapter(7, request.weights, request.config)  # lora_prefetch_dir's way in
    assert tokens(prefetched, LoraRequest(7)) == with_weights


def test_least_recently_used_unpinned_adapters_are_evicted_within_count_and_bytes(small_checkpoint):
    engine = make_engine(small_checkpoint, max_adapters=2)
    for task_id in (1, 2):
        tokens(engine, adapter(engine, task_id))
    tokens(engine, LoraRequest(1))  # 1 is now more recent than 2
    tokens(engine, adapter(engine, 3))
    assert engine.lora_cache.task_ids == (1, 3)
    with pytest.raises(InvalidRequestError, match="LoRA task 2 not found"):
        engine.add_request([1, 2], GREEDY, lora=LoraRequest(2))
    size = engine.lora_cache.nbytes // 2  # every adapter here is the same size
    by_bytes = make_engine(small_checkpoint, host_memory_bytes=2 * size + size // 2)
    for task_id in (1, 2, 3):
        tokens(by_bytes, adapter(by_bytes, task_id))
    assert by_bytes.lora_cache.task_ids == (2, 3) and by_bytes.lora_cache.nbytes == 2 * size


def test_in_flight_adapters_are_pinned_and_one_more_than_the_cache_holds_fails_alone(small_checkpoint):
    engine = make_engine(small_checkpoint, max_adapters=2)
    reference = make_engine(small_checkpoint, max_adapters=2)
    first, second = ([engine.add_request(p, GREEDY, lora=adapter(engine, task_id)) for p in PROMPTS] for task_id in (1, 2))
    with pytest.raises(InvalidRequestError, match="PEFT Cache is full. Could not store taskId=3: 2 adapters in flight") as full:
        engine.add_request(PROMPTS[0], GREEDY, lora=adapter(engine, 3))
    assert full.value.field == "lora_task_id"
    assert engine.lora_cache.task_ids == (1, 2) and engine.lora_cache.pins(1) == len(PROMPTS)
    done = {}
    while engine.has_unfinished():
        done.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
    assert [done[r] for r in first] == tokens(reference, adapter(reference, 1))
    assert [done[r] for r in second] == tokens(reference, adapter(reference, 2))
    assert engine.lora_cache.pins(1) == engine.lora_cache.pins(2) == 0
    tokens(engine, adapter(engine, 3))  # now 1, the least recently used, makes room
    assert engine.lora_cache.task_ids == (2, 3)
    aborted = engine.add_request(PROMPTS[0], GREEDY, lora=LoraRequest(3))
    engine.abort(aborted)
    assert engine.lora_cache.pins(3) == 0


def _truncated(request: LoraRequest) -> LoraRequest:
    return LoraRequest(request.task_id, request.weights[:, :, :10], request.config)


def _config(request: LoraRequest, row: int, column: int, value: int) -> LoraRequest:
    config = request.config.copy()
    config[0, row, column] = value
    return LoraRequest(request.task_id, request.weights, config)


def _with_nan(request: LoraRequest) -> LoraRequest:
    weights = request.weights.copy()
    weights[0, 3, 5] = float("nan")
    return LoraRequest(request.task_id, weights, request.config)


BAD_INPUTS = {
    # name: (make the request from a good one, field, message)
    "weights without config": (lambda r: LoraRequest(r.task_id, r.weights), "lora_config", "is missing: lora_weights came without it"),
    "config without weights": (lambda r: LoraRequest(r.task_id, config=r.config), "lora_weights", "is missing: lora_config came without it"),
    "weights without a task id": (lambda r: LoraRequest(None, r.weights, r.config), "lora_task_id", "lora_task_id must be set"),
    "a negative task id": (lambda r: LoraRequest(-1), "lora_task_id", "unsigned 64-bit integer"),
    "rows shorter than the model needs": (_truncated, "lora_weights", "row 0 (attn_qkv, layer 0, rank 4): needs rank × (in + out) = 4 × (32 + 64)"),
    "fewer weights rows than config rows": (lambda r: LoraRequest(r.task_id, r.weights[:, :-1], r.config), "lora_weights", "one weights row per config row"),
    "a batch axis of 2": (lambda r: LoraRequest(r.task_id, r.weights.repeat(2, 0), r.config), "lora_weights", "one request's batch of 1"),
    "two config columns": (lambda r: LoraRequest(r.task_id, r.weights, r.config[:, :, :2]), "lora_config", "has 2 columns"),
    "float config": (lambda r: LoraRequest(r.task_id, r.weights, r.config.astype("float32")), "lora_config", "must hold integers"),
    "integer weights": (lambda r: LoraRequest(r.task_id, r.weights.astype("int32"), r.config), "lora_weights", "floating-point"),
    "an MoE expert module": (lambda r: _config(r, 0, 0, 13), "lora_config", "lora module moe_h_to_4h not enabled for this model"),
    "an unknown module id": (lambda r: _config(r, 0, 0, 99), "lora_config", "lora module unknown id 99 not enabled"),
    "a layer the model has not got": (lambda r: _config(r, 0, 1, 2), "lora_config", "layer 2 is outside the model's layers [0, 2)"),
    "rank 0": (lambda r: _config(r, 0, 2, 0), "lora_config", "must be > 0"),
    "a rank above the cache's largest": (lambda r: _config(r, 0, 2, 9), "lora_config", "rank 9 exceeds the largest adapter size 8"),
    "a module twice in a layer": (lambda r: _config(r, 1, 0, int(r.config[0, 0, 0])), "lora_config", "a second row for attn_qkv of layer 0"),
    "a DoRA row": (
        lambda r: LoraRequest(r.task_id, r.weights, np.concatenate((r.config, np.ones_like(r.config[:, :, :1])), axis=2)),
        "lora_config",
        "is_dora is set",
    ),
    "NaN in the weights": (_with_nan, "lora_weights", "row 3 holds NaN or infinite values"),
    "a cached task id with other weights": (lambda r: LoraRequest(1, r.weights * 2, r.config), "lora_task_id", "LoRA task 1 is cached with other weights"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_lora_inputs_fail_only_their_request(small_checkpoint, case):
    make_bad, field, message = BAD_INPUTS[case]
    reference = make_engine(small_checkpoint, max_adapter_size=8)
    expected = {task_id: tokens(reference, adapter(reference, task_id)) for task_id in (1, 2)}
    engine = make_engine(small_checkpoint, max_adapter_size=8)
    good = {task_id: [engine.add_request(p, GREEDY, lora=adapter(engine, task_id)) for p in PROMPTS] for task_id in (1, 2)}
    with pytest.raises(InvalidRequestError) as refused:
        engine.add_request(PROMPTS[0], GREEDY, lora=make_bad(adapter(engine, 5)))
    assert refused.value.field == field and message in str(refused.value), str(refused.value)
    assert engine.lora_cache.task_ids == (1, 2)  # nothing loaded, nothing evicted
    done = {}
    while engine.has_unfinished():
        done.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
    assert {task_id: [done[r] for r in ids] for task_id, ids in good.items()} == expected


def test_a_module_outside_the_builds_target_modules_and_an_adapter_larger_than_the_cache(small_checkpoint):
    engine = make_engine(small_checkpoint, target_modules=("attn_q", "attn_v"))
    assert sorted(engine.lora_cache.targets) == [1, 3]
    with pytest.raises(InvalidRequestError, match=r"lora module attn_k not enabled for this model \(enabled: attn_q \(1\), attn_v \(3\)\)"):
        engine.add_request([1], GREEDY, lora=adapter(make_engine(small_checkpoint), 1, modules=(1, 2)))
    tiny = make_engine(small_checkpoint, host_memory_bytes=1000)
    with pytest.raises(InvalidRequestError, match="more than the whole LoRA cache \\(1000 bytes") as too_big:
        tiny.add_request([1], GREEDY, lora=adapter(tiny, 1))
    assert too_big.value.field == "lora_weights" and tiny.lora_cache.task_ids == ()
    with pytest.raises(InvalidRequestError, match="must be a LoraRequest"):
        engine.add_request([1], GREEDY, lora=7)


def test_an_engine_built_with_lora_reads_its_rank_and_modules(small_checkpoint):
    build_config = {"plugin_config": {"lora_plugin": "float16"}, "lora_config": {"max_lora_rank": 16, "lora_target_modules": ["attn_q"]}}
    assert EngineConfig.from_build_config(build_config).lora == LoraSettings(max_adapter_size=16, target_modules=("attn_q",))
    assert EngineConfig.from_build_config({"lora_config": {"max_lora_rank": 16}}).lora == LoraSettings()  # no plugin: defaults


@pytest.mark.parametrize("sizes", [(4, 4, 4), (1, 9, 2), (70, 1, 1)])
def test_grouped_updates_equal_each_rows_own_adapter(small_checkpoint, sizes):
    """Both ways of grouping (padded batched GEMMs, a loop per adapter) add x Aᵀ Bᵀ of each row's own adapter's modules
    in their columns and nothing to the base rows, also over the rows the last layer keeps."""
    engine = make_engine(small_checkpoint)
    adapters = [engine.lora_cache.acquire(adapter(engine, task_id, rank=2 + task_id)) for task_id in range(len(sizes))]
    groups = [index for index, size in enumerate(sizes) for _ in range(size)] + [-1] * 3
    row_group = torch.tensor(groups)[torch.randperm(len(groups), generator=torch.Generator().manual_seed(0))]
    batch = LoraBatch(tuple(adapters), row_group, LoraStacks())
    assert batch.padded == (sizes != (70, 1, 1))  # padding past the rows themselves: the loop
    for site_batch, rows in ((batch, list(range(len(groups)))), (batch.select([0, 5, 7, 2]), [0, 5, 7, 2])):
        for (layer, site), modules in adapters[0].sites.items():
            x = torch.randn(len(groups), modules[0].shrink.shape[0])
            widths = engine.lora_cache.shape.site_widths()[site]
            outputs = tuple(torch.zeros(len(rows), width) for width in widths)
            site_batch.add(layer, site, x[rows], outputs)
            for position, row in enumerate(rows):
                group = int(row_group[row])
                expected = torch.zeros(sum(widths))
                for module in adapters[group].sites[(layer, site)] if group >= 0 else ():
                    update = x[row] @ module.shrink.float() @ module.expand.float()  # kept as sent (fp16)
                    for first, column, count in module.placements:
                        expected[column : column + count] += update[first : first + count]
                torch.testing.assert_close(torch.cat([o[position] for o in outputs]), expected, rtol=1e-4, atol=1e-5)
