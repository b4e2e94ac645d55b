"""The machine and the workload as data: topology and shared resources (machine), memory footprints and
feasibility (memory), transformer arithmetic: FLOPs, parameters, bytes (model)."""
