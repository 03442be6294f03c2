"""The load sweep's command (`bench load`): arguments, workload and output files over the load-test
library pipeline/load/. Nothing is imported here."""
