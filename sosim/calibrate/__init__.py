"""Timing harness that measures real kernels, copies and CPU optimizer steps on a GPU machine.

Why a separate package: the simulator never imports torch. Everything here imports torch lazily, inside
functions, so that ``import sosim.calibrate`` stays cheap and works on machines without torch; only
``sosim.calibrate.cli.main`` (and the modules it loads) needs torch and a CUDA GPU.

The modules are deliberately free of ``sosim.*`` imports (only relative imports inside this package), so
a copy of this folder alone runs the harness even while the rest of the simulator is mid-edit.
"""
