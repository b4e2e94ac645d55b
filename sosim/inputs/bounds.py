"""Sanity bounds of sosim's inputs and the check that numbers are numbers (docs/limits.md).

The bounds are far outside anything real: they catch typos, unit mistakes and runaway inputs, each with a
message that names the key. :func:`field_problem` is what every config model (sosim/inputs/config.py ``_Strict``)
asks of each raw value before pydantic converts it: pydantic's lax mode would read ``layers: true`` as 1 layer
and ``activation_checkpointing: 1`` as true.
"""

from __future__ import annotations

import functools
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Field

# Input bounds (docs/limits.md). Integers: above 2^53 a float no longer holds every integer, and the cost model
# computes in floats; no count or size sosim takes comes near it (the work bound in sosim/run/loader.py refuses far
# smaller layer counts).
MAX_INT = 2**53
# GPUs of one run: the largest training clusters today are ~1e5 GPUs; 1e6 leaves a 10x margin while refusing
# nonsense such as 1e9 GPUs (which otherwise "fits" and predicts 5e13 tokens/s).
MAX_GPUS = 1_000_000
# Link and memory bandwidths, GB/s: 1e-3 (1 MB/s) is below any real link (PCIe 1.0 x1 is 0.25 GB/s, 1 GbE
# 0.125 GB/s); 1e6 (1 PB/s) is 200x today's fastest HBM (4.8 TB/s, H200). Outside this a value is a typo or a
# unit mistake, and 1e-300 GB/s turned a step into 1e300 s without a word.
MIN_GBPS = 1e-3
MAX_GBPS = 1e6

# The same reason applies to every other physical number of a profile (issue 26: 1e-300 TFLOPS, 1e300 us of
# latency or per-layer overhead, 1e-300 efficiencies gave "feasible" steps of 1e294-1e302 s). Each range is far
# outside anything real, so it only catches typos, unit mistakes and runaway inputs:
# - GPU peak TFLOP/s: 1e-3 (1 GFLOP/s) is below any GPU since 2005; 1e5 (100 PFLOP/s) is ~45x a B200's
#   dense bf16 (2.25 PFLOP/s, NVIDIA Blackwell datasheet).
MIN_TFLOPS = 1e-3
MAX_TFLOPS = 1e5
# - efficiencies and fractions of a peak (GEMM, attention, HBM, pageable copies): below 0.1% a measurement is
#   broken (the lowest shipped value is a small GEMM's ~1%); 1 is the peak itself.
MIN_FRACTION = 1e-3
# - memory capacities, GiB: 1 MiB to 1 PiB (the largest single hosts have 32 TiB; an H200 has 141 GB).
MIN_GIB = 1e-3
MAX_GIB = 1e6
# - latencies and fixed per-layer costs, us: up to one second (a link, a launch or a hook that takes a second
#   is not one; PCIe is ~1 us, an inter-node hop ~10 us).
MAX_US = 1e6
# - ratios of one cost to another (attention backward / forward ~2-2.5, eager / fused traffic ~1-4, a host
#   thread's speed relative to the reference VM ~0.5-2): 0.01 to 100.
MIN_RATIO = 1e-2
MAX_RATIO = 1e2
# - counts of cores, sockets, NICs, drives per node: at most 100,000 (the largest sockets have 192 cores).
MAX_COUNT = 100_000
# - whole-step CPU Adam, seconds per billion parameters (y / x of adam_s_by_gparams): 1e-4 s is 30x below what
#   an H200's HBM needs just to stream Adam's 16 bytes per parameter (16 GB / 4.8 TB/s = 3.3 ms); 1e4 s is
#   hours per billion, slower than one 2005 core. A curve of (1, 1e-300) gave a NaN demand.
MIN_ADAM_S_PER_GPARAM = 1e-4
MAX_ADAM_S_PER_GPARAM = 1e4
# - curve x values (GEMM GFLOP, Adam Gparams, collective MiB): positive and at most 1e9.
MAX_CURVE_X = 1e9
# - page size, KiB: 1 (below any CPU's 4 KiB) to 1,048,576 (1 GiB huge pages).
MAX_PAGE_KIB = 1024.0 * 1024.0

Tflops = Annotated[float, Field(ge=MIN_TFLOPS, le=MAX_TFLOPS)]
Efficiency = Annotated[float, Field(ge=MIN_FRACTION, le=1)]
CapacityGiB = Annotated[float, Field(ge=MIN_GIB, le=MAX_GIB)]
ReserveGiB = Annotated[float, Field(ge=0, le=MAX_GIB)]
Microseconds = Annotated[float, Field(ge=0, le=MAX_US)]
CostRatio = Annotated[float, Field(ge=MIN_RATIO, le=MAX_RATIO)]
Count = Annotated[int, Field(gt=0, le=MAX_COUNT)]
PageKiB = Annotated[float, Field(ge=1, le=MAX_PAGE_KIB)]

# Why each bounded field has its bound, named in its message (sosim/run/loader.py _format_validation).
BOUND_REASONS: dict[str, str] = {
    "peak_bf16_tflops": f"a GPU peak between {MIN_TFLOPS:g} and {MAX_TFLOPS:g} TFLOP/s: slower than any GPU, or "
                        "45x the fastest",
    **dict.fromkeys(("hbm_efficiency", "attention_efficiency", "pageable_factor", "gemm_efficiency"),
                    f"a fraction of a peak between {MIN_FRACTION:g} and 1"),
    **dict.fromkeys(("hbm_gib", "mem_gib", "capacity_gib", "reserved_gib"),
                    f"a memory size of at most {MAX_GIB:g} GiB (1 PiB)"),
    **dict.fromkeys(("latency_us", "layer_overhead_us", "layer_min_fwd_us"),
                    f"at most {MAX_US:g} us (one second): no link, launch or hook takes that long"),
    **dict.fromkeys(("attention_bwd_factor", "elementwise_traffic_factor", "host_thread_speed"),
                    f"a ratio of costs between {MIN_RATIO:g} and {MAX_RATIO:g}"),
    **dict.fromkeys(("cores", "adam_ref_cores", "adam_saturation_cores", "cpu_sockets", "count", "drives"),
                    f"a count of at most {MAX_COUNT:,}"),
    "page_kib": f"a page size between 1 and {MAX_PAGE_KIB:g} KiB",
}


def curve_problem(curve: Any, y_range: tuple[float, float] | None = None,
                  y_per_x: tuple[float, float] | None = None) -> str | None:
    """Why a (x, y) curve is outside its physical range: x above MAX_CURVE_X, y outside ``y_range``, or
    y / x outside ``y_per_x`` (None: inside; the curve's own shape is checked by its model)."""
    for x, y in curve:
        if x > MAX_CURVE_X:
            return f"x values must be at most {MAX_CURVE_X:g}, got {x:g}"
        if y_range is not None and not y_range[0] <= y <= y_range[1]:
            return f"values must be between {y_range[0]:g} and {y_range[1]:g}, got {y:g}"
        if y_per_x is not None and x > 0 and not y_per_x[0] <= y / x <= y_per_x[1]:
            return (f"({x:g}, {y:g}) is {y / x:g} s per billion parameters; a CPU Adam step takes between "
                    f"{y_per_x[0]:g} and {y_per_x[1]:g} s per billion (docs/limits.md)")
    return None


def _leaf_types(tp: Any) -> set[Any]:
    """The types a field annotation admits at its leaves (list[tuple[float, float]] -> {float})."""
    origin = get_origin(tp)
    if origin is Literal:
        return {type(a) for a in get_args(tp)}
    if origin is Annotated:
        return _leaf_types(get_args(tp)[0])
    args = [a for a in get_args(tp) if a is not Ellipsis]
    if args and (origin in (Union, types.UnionType) or origin is not None):
        return set().union(*(_leaf_types(a) for a in args))
    return {tp}


@functools.cache
def _numbers_only(model: type[BaseModel], name: str) -> bool:
    """Whether field ``name`` of ``model`` holds numbers (at its leaves) and no booleans."""
    field = model.model_fields.get(name)
    if field is None:
        return False
    leaves = _leaf_types(field.annotation)
    return bool(leaves & {int, float}) and not leaves & {bool, Any, object}


@functools.cache
def _bool_only(model: type[BaseModel], name: str) -> bool:
    """Whether field ``name`` of ``model`` is a yes/no (bool, or bool | None)."""
    field = model.model_fields.get(name)
    return field is not None and _leaf_types(field.annotation) - {type(None)} == {bool}


def _bad_number(value: Any, depth: int = 0) -> str | None:
    """Why ``value`` (or a value inside it) is not a number sosim takes: a boolean, or an integer beyond MAX_INT."""
    if isinstance(value, bool):
        return ("expected a number, got a boolean (YAML reads true/false, yes/no, on/off as booleans; "
                "write the number)")
    if isinstance(value, int) and abs(value) > MAX_INT:
        return (f"an integer of {len(str(abs(value)))} digits is beyond {MAX_INT:,} (2^53), larger than any "
                "quantity sosim takes (docs/limits.md)")
    if depth < 4 and isinstance(value, (list, tuple)):
        return next((bad for v in value if (bad := _bad_number(v, depth + 1))), None)
    if depth < 4 and isinstance(value, dict):
        return next((bad for v in value.values() if (bad := _bad_number(v, depth + 1))), None)
    return None


def field_problem(model: type[BaseModel], name: str, value: Any) -> str | None:
    """Why ``value`` does not fit field ``name``: a boolean for a number, a number for a yes/no, an integer
    beyond MAX_INT (None: fine, or left to the field's own validation)."""
    t = type(value)
    if t is bool:
        return _bad_number(value) if _numbers_only(model, name) else None
    if _bool_only(model, name):
        return f"expected true or false, got {value!r}"
    if t is float or t is str or (t is int and -MAX_INT <= value <= MAX_INT):
        return None
    return _bad_number(value) if _numbers_only(model, name) else None


class FieldProblem(ValueError):
    """A problem with one field, raised by a model-level check: the loader locates it at ``field`` (a key of
    the model, or a dotted path below it: the line of that key), not at the section."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.field.split("."))


__all__ = ["BOUND_REASONS", "MAX_GBPS", "MAX_GPUS", "MAX_INT", "MIN_GBPS", "CapacityGiB", "CostRatio", "Count",
           "Efficiency", "FieldProblem", "Microseconds", "PageKiB", "ReserveGiB", "Tflops", "curve_problem",
           "field_problem"]
