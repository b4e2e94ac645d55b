"""What users ask, built on simulate() (sosim.run): sweeps, error bands, validation against references, compare,
max model size, ablation, the tuner, check (CI baselines), calibrate --check, worker pools."""
