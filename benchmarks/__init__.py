"""siglo's benchmark harness (not shipped in the wheel).

``python -m benchmarks`` runs the same workloads against siglo's backends and against
the raw drivers doing the equivalent work, in one process, and reports siglo / raw
ratios. See ``docs/benchmarks.md`` for the method and what "equivalent" means per
workload.
"""
