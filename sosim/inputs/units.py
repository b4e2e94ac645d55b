"""Unit constants and converters.

Inside the simulator everything is SI: seconds, bytes, bytes/s, FLOP/s. YAML files use the units named in
their keys (``_gib``, ``_GBps``, ``_tflops``, ``_us``, ``_mb``); these helpers convert at the boundary so
that no other module multiplies by a magic 1e9.
"""

from __future__ import annotations

GIB: float = 1024.0**3  # bytes in one GiB (memory capacities are quoted in binary units)
MIB: float = 1024.0**2
GB: float = 1e9  # bandwidths are quoted in decimal GB/s by every vendor
MB: float = 1e6
TFLOP: float = 1e12
US: float = 1e-6  # one microsecond in seconds

# Bytes per element of the dtypes the schedules move around.
BF16_BYTES: int = 2
FP32_BYTES: int = 4


def us_to_s(us: float) -> float:
    return us * US
