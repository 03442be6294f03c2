"""Cumulative engine counters for monitoring (`LLMEngine.stats()`): a read-only snapshot.

Every figure only grows while the engine lives, so a metrics exporter can publish them as
counters. Prompt tokens: a prompt token is either `reused` (its K/V came from the prefix cache
at admission) or `computed` by the model; a preempted sequence recomputes its prompt, so that
counts again as computed (and a prefix reused on re-admission counts again as reused).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    num_steps: int = 0  # engine iterations that ran the model
    num_generated_tokens: int = 0  # tokens that joined a request's output (every sample of n)
    num_prompt_tokens_computed: int = 0  # prompt tokens whose K/V the model computed (recompute included)
    num_prompt_tokens_reused: int = 0  # prompt tokens whose K/V were reused from the prefix cache
    num_prefix_cache_hits: int = 0  # admissions that reused at least one cached block
    num_preemptions: int = 0  # sequences preempted by recompute
    num_draft_tokens: int = 0  # speculative decoding: draft tokens verified by the target
    num_accepted_draft_tokens: int = 0  # ... and accepted
    # Medusa: sequence-steps that verified a tree (accepted tokens per step: num_accepted_draft_tokens / num_tree_steps),
    # and how often each node of the tree was accepted, as (path, count) pairs (path: TensorRT-LLM's medusa_choices form)
    num_tree_steps: int = 0
    tree_node_acceptances: tuple[tuple[tuple[int, ...], int], ...] = ()
