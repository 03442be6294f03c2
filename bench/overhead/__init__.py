"""The serving-overhead benchmark (`bench overhead`): what Triton adds on top of the engine, path by
path (HTTP, gRPC, streamed, BLS) against the same engine in this process. `bench.run_serve_bench`
measures, `report.render_serve_markdown` makes the tables. Nothing is imported here."""
