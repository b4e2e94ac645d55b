"""What users ask, built on simulate(): the result and its breakdown, sweeps, error bands, validation
against references, compare, max model size, ablation, the tuner, check (CI baselines), worker pools."""
