"""Benchmarks (commands, not timed tests; docs/architecture.md#benchmarks): `trtllm-pipeline bench BENCHMARK`.

- `load/`: the load sweep (`bench load`; TTFT, ITL, throughput, goodput over a concurrency or
  request-rate sweep), a command over the load-test library `pipeline/load/`.
- `overhead/`: what Triton adds per request over the engine in this process (`bench overhead`).
- `capacity/`: streamed tokens/s the Python models sustain around a GPU-pace stand-in (`bench capacity`).
- `engine/`: refengine's inflight batching against static batching and transformers (`bench engine`).
- `soak/`: chaos traffic for a while, then proof that nothing broke (`bench soak`).
- `accuracy_bench.py`: perplexity and next-token agreement of every quantization format (`bench accuracy`).
- `commands.py`: the `bench` subcommands and their dispatch.

The benchmarks sit above the runner (they build what they measure); nothing below imports them.
Nothing is imported here: the command line builds its parser from this package and must not pull
torch in for `validate`.
"""
