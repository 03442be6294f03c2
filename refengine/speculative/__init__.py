"""Speculative decoding on the reference engine: drafters propose, the target verifies.

- `settings`: the engine directory's `refengine_speculative` key (and TensorRT-LLM's
  `build_config.max_draft_len` / `speculative_decoding_mode`), checked when the engine loads.
- `ngram`: prompt-lookup drafting (no model).
- `draft_model`: a smaller model sharing the tokenizer, with its own paged KV cache kept in
  step with the target's sequences.
- `planner`: adds draft tokens to a scheduled step (k per sequence, within the token budget,
  `max_tokens` and the KV blocks it can get).
- Medusa: `medusa_tree` (the tree of candidates, `medusa_choices`), `medusa_heads` (the heads on the
  target's last hidden state), `medusa_planner` (a tree per sequence and step), `medusa_files` (heads and
  engine directories written for tests and benchmarks), `medusa_cost` (what verifying N nodes costs).

Verification is the model runner's (`model_runner/verifier.py`, a tree's `tree_verifier.py` and
`tree_attention.py`); applying the verified tokens and
rolling back the rejected drafts' KV is the scheduler's (`scheduler/speculative_update.py`).
"""
