"""Guided decoding (structured output) with xgrammar: a grammar constrains every sampled token.

- `params.GuidedDecodingParams`: what a request asks for (TensorRT-LLM's guide types), checked
  without xgrammar (torch- and xgrammar-free, so request parsing stays light).
- `compiler.GuidedDecoder`: one per engine: the tokenizer's vocabulary and a bounded LRU of compiled
  grammars, one per distinct (guide type, guide); every refusal is an `InvalidRequestError`.
- `state.GrammarState`: one per sequence, owned by the scheduler's `Sequence`: the allowed-token
  mask for the next position, advanced on each accepted token, forked with `n` > 1.
- `tokenizer_info`: reads TensorRT-LLM's `xgrammar_tokenizer_info.json`.
"""
