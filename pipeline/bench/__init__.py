"""Benchmarks (commands, not timed tests; ARCHITECTURE.md §9).

`engine_bench.run_engine_bench`: refengine's inflight batching against static batching, transformers'
static `generate` and transformers' continuous batching, plus KV-cache utilisation and prefix reuse.
`report.render_markdown` turns its result into the tables of BENCHMARKS.md. Nothing is imported here:
the command line builds its parser from this package and must not pull torch in for `validate`.
"""
