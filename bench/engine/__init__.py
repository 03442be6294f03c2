"""The engine benchmark (`bench engine`): refengine's inflight batching against static batching,
transformers' static `generate` and transformers' continuous batching, plus KV-cache utilisation
and prefix reuse. `bench.run_engine_bench` measures, `report.render_markdown` makes the tables of
BENCHMARKS.md. Nothing is imported here."""
