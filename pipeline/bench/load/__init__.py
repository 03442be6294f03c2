"""The load sweep's command (`bench load`): arguments, workload and output files over the load-test
library pipeline/loadtest/. Nothing is imported here."""
