"""The plan and the engines that run it: typed ops and the one-iteration template (plan), shared
resources and the fluid contention model (contention, fluid), SimPy, the reference (simpy_engine), and
one faster exact engine (fast)."""
