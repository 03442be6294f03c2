"""Multi-LoRA in refengine (refengine/lora) against transformers + PEFT, for every kind of decoder it runs.

Each family's tiny random model (the family tests' fixtures) gets two PEFT adapters with random, non-zero lora_A and
lora_B (values exact in float16, lora_alpha / r = 2, so NVIDIA's float16 tensors hold them exactly), saved with
`save_pretrained` and converted by `clients.lora_tensors` into NVIDIA's lora_weights / lora_config. One engine batch
mixes both adapters and the base model over several prompts; each output equals transformers' greedy `generate` of
the PEFT model with that adapter merged (`merge_and_unload`), token for token. Modules: Llama, Qwen3 (q/k norms after
the q/k updates) and Gemma / Gemma 3 on every projection; Phi-3 on its fused qkv_proj / gate_up_proj (TensorRT-LLM's
attn_qkv and its fused mlp_h_to_4h); StarCoder2 (TensorRT-LLM's GPT class: LayerNorm, biased Linears, an ungated
MLP) on attention and c_fc / c_proj (mlp_h_to_4h / mlp_4h_to_h); Qwen3-MoE on attention only: TensorRT-LLM's MoE expert modules (moe_h_to_4h,
moe_4h_to_h, moe_gate, moe_router) are sized hidden × experts in its C++ `LoraModule` with a "TODO(TRTLLM-379): Support
MOE LoRA weights", and hf_lora_convert.py writes no expert rows; here they are refused by name.

Also: prefix-cache blocks are keyed by adapter; chunked prefill and prefix reuse keep the outputs; one forward runs per
engine step whatever the adapters; an adapter's beam search is transformers' on the merged model; an FP8 checkpoint
adds the same updates on its quantized Linears.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from clients.lora_tensors import convert_peft_adapter
from refengine import InvalidRequestError, LoraRequest, SamplingParams
from refengine.model_runner.llama import LlamaModel
from tests.refengine.conftest import hf_greedy
from tests.support.family_fixtures import FAMILY_SPECS, MOE_SPECS, build_family_model, family_engine, random_prompts
from tests.support.gemma_fixtures import build_gemma_model

MAX_NEW_TOKENS = 16
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
EVERY_PROJECTION = ATTENTION + ["gate_proj", "up_proj", "down_proj"]
TARGETS = {
    "llama": EVERY_PROJECTION,
    "qwen3": EVERY_PROJECTION,
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
    "qwen3_moe": ATTENTION,
    "gemma": EVERY_PROJECTION,
    "gemma3_text": EVERY_PROJECTION,
    "starcoder2": ATTENTION + ["c_fc", "c_proj"],
}
RANK, ALPHA = 4, 8


@dataclass
class Case:
    checkpoints: dict[str, Path]  # format -> TensorRT-LLM checkpoint
    hf_model: Any  # float32 with the checkpoint's fp16 values


@pytest.fixture(scope="module")
def lora_model(tmp_path_factory, tiny_model):
    """`lora_model(name)`: the family model of TARGETS' name, built on first use."""
    root = tmp_path_factory.mktemp("lora_families")
    built: dict[str, Case] = {}

    def build(name: str) -> Case:
        if name not in built:
            if name == "llama":
                model = tiny_model("llama_gqa")
                built[name] = Case({"fp16": model.checkpoint_dir}, model.hf_model)
            elif name.startswith("gemma"):
                model = build_gemma_model(name, root)
                built[name] = Case({"fp16": model.checkpoint_dir}, model.hf_model)
            else:
                formats = ("fp16", "fp8") if name == "qwen3" else ("fp16",)
                family = build_family_model(name, root, formats, MOE_SPECS if name in MOE_SPECS else FAMILY_SPECS)
                built[name] = Case(family.checkpoints, family.hf_model)
        return built[name]

    return build


def make_adapter(hf_model: Any, targets: list[str], seed: int, directory: Path) -> tuple[Any, LoraRequest]:
    """A PEFT adapter saved in `directory`: (transformers model with it merged, its LoraRequest of task id `seed`)."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(copy.deepcopy(hf_model), LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=targets, lora_dropout=0.0))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:  # B too (PEFT starts it at zero): the adapter must change the output
                parameter.copy_((0.1 * torch.randn(parameter.shape, generator=generator)).half().float())
    peft_model.save_pretrained(directory)
    tensors = convert_peft_adapter(directory)
    return peft_model.merge_and_unload().eval(), LoraRequest(seed, tensors.weights, tensors.config)


GREEDY = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_each_adapter_matches_transformers_peft_in_one_mixed_batch(lora_model, tmp_path, name):
    case = lora_model(name)
    adapters = {task_id: make_adapter(case.hf_model, TARGETS[name], task_id, tmp_path / str(task_id)) for task_id in (1, 2)}
    references = {None: case.hf_model, **{task_id: merged for task_id, (merged, _) in adapters.items()}}
    requests = [(prompt, task_id) for prompt in random_prompts(name) for task_id in (1, 2, None)]
    sent: set[int] = set()  # weights with a task's first request, its id alone afterwards (as NVIDIA's client does)
    lora = []
    for _, task_id in requests:
        lora.append(None if task_id is None else adapters[task_id][1] if task_id not in sent else LoraRequest(task_id))
        sent.add(task_id)
    engine = family_engine(case.checkpoints["fp16"], max_batch_size=len(requests))
    outputs = engine.generate([prompt for prompt, _ in requests], GREEDY, lora=lora)
    for (prompt, task_id), output in zip(requests, outputs):
        assert output.outputs[0].token_ids == hf_greedy(references[task_id], prompt, MAX_NEW_TOKENS), f"{name}: adapter {task_id}, prompt {len(prompt)}"
    by_task = {task_id: [o.outputs[0].token_ids for (_, t), o in zip(requests, outputs) if t == task_id] for task_id in (1, 2, None)}
    assert by_task[1] != by_task[None] and by_task[2] != by_task[None] and by_task[1] != by_task[2]
    assert engine.lora_cache.task_ids == (1, 2) and engine.lora_cache.pins(1) == engine.lora_cache.pins(2) == 0


def test_moe_experts_and_the_mlp_modules_of_moe_layers_are_refused(lora_model):
    engine = family_engine(lora_model("qwen3_moe").checkpoints["fp16"])
    assert sorted(engine.lora_cache.targets) == [0, 1, 2, 3, 4]  # attn_qkv, attn_q, attn_k, attn_v, attn_dense
    for module_id, name in ((5, "mlp_h_to_4h"), (13, "moe_h_to_4h"), (16, "moe_router")):
        config = torch.tensor([[module_id, 0, 2]], dtype=torch.int32)
        with pytest.raises(InvalidRequestError, match=f"lora module {name} not enabled for this model") as refused:
            engine.add_request([5, 6], GREEDY, lora=LoraRequest(9, torch.zeros(1, 4096, dtype=torch.float16), config))
        assert refused.value.field == "lora_config"


def test_prefix_blocks_are_keyed_by_adapter_and_one_forward_runs_per_step(lora_model, tmp_path, monkeypatch):
    """Chunked prefill (8-token chunks beside decodes), prefix caching: a prompt's blocks computed under one adapter serve
    it again, never another adapter or the base model; the outputs stay transformers + PEFT's; every engine step runs the
    model once, whatever the mix of adapters."""
    case = lora_model("llama")
    adapters = {task_id: make_adapter(case.hf_model, EVERY_PROJECTION, task_id, tmp_path / str(task_id)) for task_id in (1, 2)}
    references = {None: case.hf_model, 1: adapters[1][0], 2: adapters[2][0]}
    forwards = []
    original = LlamaModel.forward
    monkeypatch.setattr(LlamaModel, "forward", lambda self, *args, **kwargs: forwards.append(1) or original(self, *args, **kwargs))
    engine = family_engine(case.checkpoints["fp16"], tokens_per_block=4, max_num_tokens=8, enable_chunked_context=True, enable_prefix_caching=True)
    prompt = random_prompts("llama", (30,))[0]

    def run(task_id, *, weights: bool = False):
        hits = engine.stats().num_prefix_cache_hits
        lora = None if task_id is None else adapters[task_id][1] if weights else LoraRequest(task_id)
        [output] = engine.generate([prompt], GREEDY, lora=lora)
        assert output.outputs[0].token_ids == hf_greedy(references[task_id], prompt, MAX_NEW_TOKENS), f"adapter {task_id}"
        return engine.stats().num_prefix_cache_hits - hits

    assert run(1, weights=True) == 0
    assert run(2, weights=True) == 0  # the same tokens, another adapter: nothing reused
    assert run(None) == 0
    assert run(1) == 1 and run(2) == 1 and run(None) == 1  # each reuses its own
    steps, forwards[:] = engine.stats().num_steps, []
    prompts = random_prompts("llama")
    mixed = [(p, t) for p in prompts for t in (1, None, 2)]
    outputs = engine.generate([p for p, _ in mixed], GREEDY, lora=[None if t is None else LoraRequest(t) for _, t in mixed])
    for (p, task_id), output in zip(mixed, outputs):
        assert output.outputs[0].token_ids == hf_greedy(references[task_id], p, MAX_NEW_TOKENS), f"adapter {task_id}, prompt {len(p)}"
    assert len(forwards) == engine.stats().num_steps - steps


def test_quantized_linears_get_the_same_updates(lora_model, tmp_path):
    """FP8 Qwen3 (quantized q/k/v/o/MLP Linears): the adapter shifts its prompt logits as it shifts the fp16 model's
    (cosine of the shifts measured 0.995; FP8's own noise keeps it below 1). The update is added to the quantized
    Linear's output, as TensorRT-LLM's LoRA plugin adds it beside the quantized GEMM."""
    case = lora_model("qwen3")
    _, adapter = make_adapter(case.hf_model, EVERY_PROJECTION, 1, tmp_path / "adapter")
    prompt = random_prompts("qwen3", (48,))[0]
    wanting_logits = SamplingParams(max_tokens=1, temperature=0, return_context_logits=True)

    def logits(fmt: str, lora: LoraRequest | None) -> torch.Tensor:
        [output] = family_engine(case.checkpoints[fmt]).generate([prompt], wanting_logits, lora=lora)
        return output.context_logits

    shifts = {fmt: logits(fmt, adapter) - logits(fmt, None) for fmt in ("fp16", "fp8")}
    cosine = torch.nn.functional.cosine_similarity(shifts["fp16"].flatten(), shifts["fp8"].flatten(), dim=0)
    assert shifts["fp8"].abs().mean() > 0.05  # measured 0.53
    assert cosine > 0.98, f"cosine of the adapter's logit shifts, fp8 vs fp16: {cosine:.3f}"


def test_beams_of_an_adapters_request_are_transformers_beams_of_the_merged_model(lora_model, tmp_path):
    from tests.refengine.test_refengine_beam_search import hf_beams

    case = lora_model("llama")
    merged, adapter = make_adapter(case.hf_model, EVERY_PROJECTION, 1, tmp_path / "adapter")
    prompt = random_prompts("llama", (12,))[0]
    beams = SamplingParams(max_tokens=8, beam_width=3, n=3, temperature=0)
    engine = family_engine(case.checkpoints["fp16"], max_beam_width=3)
    [output, base] = engine.generate([prompt, prompt], beams, lora=[adapter, None])
    expected = hf_beams(merged, prompt, beams=3, max_new_tokens=8, num_return=3)
    assert [completion.token_ids for completion in output.outputs] == [tuple(tokens) for tokens, _ in expected]
    assert [c.token_ids for c in output.outputs] != [c.token_ids for c in base.outputs]
