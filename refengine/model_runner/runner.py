"""The model runner: owns the paged KV tensors and executes one `SchedulerOutput` per step."""

from __future__ import annotations

import torch

from refengine.lora.batch import LoraBatch, LoraStacks
from refengine.model_runner.attention import AttentionMetadata, build_attention_metadata
from refengine.model_runner.decoder import DecoderModel
from refengine.model_runner.sampler import Sampler
from refengine.model_runner.tree_attention import keep_accepted_kv, with_tree
from refengine.model_runner.tree_verifier import verify_tree
from refengine.model_runner.verifier import verify_drafts
from refengine.step_messages import RunnerOutput, SampledToken, ScheduledSequence, SchedulerOutput


def by_adapter(items: tuple[ScheduledSequence, ...]) -> tuple[ScheduledSequence, ...]:
    """The step's sequences, those of each LoRA adapter together (base model first, then by task id), so that each
    adapter's rows are one block of the flat batch (lora/batch.py slices them instead of gathering). The runner's output
    is keyed by sequence and every sequence samples from its own seed, so the order changes nothing else."""
    if all(item.lora is None for item in items):
        return items
    return tuple(sorted(items, key=lambda item: -1 if item.lora is None else item.lora.task_id))


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a compute-dtype name ("float32", "float16", "bfloat16")."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"{name!r} is not a floating-point torch dtype")
    return dtype


class ModelRunner:
    def __init__(self, model: DecoderModel, num_blocks: int, tokens_per_block: int) -> None:
        self.model = model
        self.tokens_per_block = tokens_per_block
        self.kv_caches = model.kv_cache_layout.allocate(num_blocks, tokens_per_block)
        self.sampler = Sampler()
        self.lora_stacks = LoraStacks()

    @torch.inference_mode()
    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        self._copy_blocks(scheduler_output.block_copies)
        if not scheduler_output.scheduled:
            return RunnerOutput(step_id=scheduler_output.step_id)
        items = by_adapter(scheduler_output.scheduled)
        metadata = build_attention_metadata(
            [item.num_new_tokens for item in items],
            [item.num_computed_tokens for item in items],
            [item.block_table for item in items],
            self.tokens_per_block,
            [item.num_prompt_tokens or item.num_total_tokens for item in items],
        )
        input_ids = torch.tensor([t for item in items for t in item.new_token_ids], dtype=torch.int64)
        lora = LoraBatch.of([(item.lora, item.num_new_tokens) for item in items], self.lora_stacks)
        sampling = [index for index, item in enumerate(items) if item.num_samples > 0]
        wanting_context = [index for index, item in enumerate(items) if item.sampling_params.return_context_logits]
        if any(item.draft_token_ids for item in items):
            metadata = with_tree(metadata, items)
            return self._execute_with_drafts(scheduler_output.step_id, items, input_ids, metadata, sampling, wanting_context, lora)
        if not wanting_context:
            # Hidden states of the sampled sequences' last tokens only (see DecoderModel.forward).
            hidden = self.model.forward(input_ids, self.kv_caches, metadata, last_token_of=sampling, lora=lora)
            context_logits: dict[int, tuple[int, torch.Tensor]] = {}
        else:
            hidden, context_logits = self._with_context_logits(input_ids, metadata, items, sampling, wanting_context, lora)
        if not sampling:
            return RunnerOutput(step_id=scheduler_output.step_id, context_logits=context_logits)
        logits = self.model.compute_logits(hidden)
        sampling_items = [items[index] for index in sampling]
        return RunnerOutput(
            step_id=scheduler_output.step_id,
            sampled=self.sampler.sample(logits, sampling_items),
            context_logits=context_logits,
            hidden_states={item.seq_id: hidden[row] for row, item in enumerate(sampling_items) if item.return_hidden},
        )

    def _execute_with_drafts(
        self,
        step_id: int,
        items: tuple[ScheduledSequence, ...],
        input_ids: torch.Tensor,
        metadata: AttentionMetadata,
        sampling: list[int],
        wanting_context: list[int],
        lora: LoraBatch | None,
    ) -> RunnerOutput:
        """A step in which some sequences verify draft tokens: their last k + 1 rows are scored
        (verifier.py; a tree's rows: tree_verifier.py, its accepted K/V moved into place), the other sampled sequences'
        last row is sampled as usual."""
        hidden, context_logits = self._with_context_logits(input_ids, metadata, items, None, wanting_context, lora)
        ends = torch.tensor([item.num_new_tokens for item in items]).cumsum(0).tolist()
        plain = [index for index in sampling if not items[index].draft_token_ids]
        sampled: dict[int, tuple[SampledToken, ...]] = {}
        hidden_states: dict[int, torch.Tensor] = {}
        if plain:
            logits = self.model.compute_logits(hidden[[ends[index] - 1 for index in plain]])
            sampled.update(self.sampler.sample(logits, [items[index] for index in plain]))
            hidden_states.update({items[index].seq_id: hidden[ends[index] - 1] for index in plain if items[index].return_hidden})
        for index in sampling:
            item = items[index]
            if not item.draft_token_ids:
                continue
            rows = hidden[ends[index] - len(item.draft_token_ids) - 1 : ends[index]]
            if not item.draft_tree_parents:
                sampled[item.seq_id] = verify_drafts(self.model.compute_logits(rows), item)
                continue
            sampled[item.seq_id], accepted = verify_tree(self.model.compute_logits(rows), item)
            keep_accepted_kv(self.kv_caches, item, accepted)
            if item.return_hidden:
                hidden_states[item.seq_id] = rows[accepted[-1] + 1 if accepted else 0]
        return RunnerOutput(step_id=step_id, sampled=sampled, context_logits=context_logits, hidden_states=hidden_states)

    def _with_context_logits(
        self,
        input_ids: torch.Tensor,
        metadata: AttentionMetadata,
        items: tuple[ScheduledSequence, ...],
        sampling: list[int] | None,
        wanting_context: list[int],
        lora: LoraBatch | None,
    ) -> tuple[torch.Tensor, dict[int, tuple[int, torch.Tensor]]]:
        """Every row's hidden state, so that the logits of each token of the sequences in
        `wanting_context` can be returned: (sampled rows' hidden states, {seq_id: (first position, logits)});
        with `sampling` None, every row's hidden state."""
        hidden = self.model.forward(input_ids, self.kv_caches, metadata, lora=lora)
        ends = torch.tensor([item.num_new_tokens for item in items]).cumsum(0).tolist()
        starts = [end - item.num_new_tokens for end, item in zip(ends, items)]
        context_logits = {
            items[index].seq_id: (items[index].num_computed_tokens, self.model.compute_logits(hidden[starts[index] : ends[index]])) for index in wanting_context
        }
        return (hidden if sampling is None else hidden[[ends[index] - 1 for index in sampling]]), context_logits

    def _copy_blocks(self, copies: tuple[tuple[int, int], ...]) -> None:
        for source, destination in copies:
            for kv_cache in self.kv_caches:
                kv_cache[:, destination].copy_(kv_cache[:, source])
