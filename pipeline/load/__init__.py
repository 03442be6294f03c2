"""The load-test library: what `bench load` and the performance gate (pipeline/stages/slo.py) share.

`workload` makes the requests (synthetic prompts of given token lengths, or a prompt file),
`serving` starts tritonserver (and the OpenAI front end) on free loopback ports, `sweep` drives
the served endpoints point after point through clients.load, `slo` judges one point against
the gate's thresholds and an earlier result, `report` renders a sweep as a table and a plot.

It sits below `stages` in the import order: it imports config, errors, serve and clients, never
stages, runner, cli or bench. Nothing is imported here (the command line must stay light).
"""
