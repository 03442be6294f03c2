"""Benchmarks (commands, not timed tests; ARCHITECTURE.md §9).

`run_engine_bench`: refengine's inflight batching against static batching, transformers' static
`generate` and transformers' continuous batching, plus KV-cache utilisation and prefix reuse.
`render_markdown` turns its result into the tables of BENCHMARKS.md.
"""

from pipeline.bench.engine_bench import run_engine_bench
from pipeline.bench.report import render_markdown
from pipeline.bench.workload import Workload, make_prefix_workload, make_workload

__all__ = ["Workload", "make_prefix_workload", "make_workload", "render_markdown", "run_engine_bench"]
