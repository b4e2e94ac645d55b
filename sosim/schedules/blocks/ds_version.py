"""What each modelled DeepSpeed release does differently on the paths sosim replays (issue 21).

Derived by diffing the sources (the tagged 0.18.0, 0.18.8 and 0.19.8 trees; DeepSpeed's git history
v0.18.0..v0.19.5 for the releases between), not fitted to any row. Each field is one code difference, named
with its first release and PR/commit; the systems' DeepSpeed presets read them through :func:`behaviour`.
The modelled releases themselves (and the error for any other): sosim/inputs/ds_versions.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sosim.inputs.ds_versions import Version, fmt, parse

if TYPE_CHECKING:
    from sosim.inputs.config import AdamImpl, Scenario


@dataclass(frozen=True)
class DsBehaviour:
    version: str
    # SuperOffload as released (PR 7559, commit af56ed4d3, first in v0.18.0) until PR 7906 (commit 729df6cab,
    # first in v0.18.9), superoffload_stage3.py:
    # * ``reduce_independent_p_g_buckets_and_remove_grads`` is overridden: a flush holds exactly one sub-group
    #   (the bucket is flushed when it has the sub-group's parameter count; ``reduce_bucket_size`` is not used);
    # * ``partition_grads``: per flush, the gradient partitions are concatenated and cast to fp32 on the GPU
    #   (``torch.cat(...).float()``); a CPU sub-group's fp32 gradient (a CUDA tensor) is handed to the worker,
    #   which copies it into its pinned buffer (D2H) and steps; the main process also copies it,
    #   ``non_blocking=True``, into the sub-group's fp32 host gradient. No bf16 round trip through the host
    #   buffer, no ``current_stream().synchronize()``: the host does not wait for a flush;
    # * speculation for every CPU sub-group whatever the clipping; ``step()`` rolls back and redoes them
    #   synchronously only when the norm exceeds the clip (``check_clip_grads``);
    # * ``_reassign_or_swap_out_partitioned_parameters``: a CPU sub-group is only unflattened, its fp32 master
    #   is never copied back into the GPU's bf16 partition (no refresh; the Alps study's "parameters not
    #   updated").
    # From PR 7906: bf16 round trip + fp32 copy per parameter into the shared fp32 gradient, a stream sync per
    # completed sub-group, Adam handed off only without clipping, a blocking CPU-cast refresh per sub-group.
    superoffload_release_path: bool
    # ``gradient_clipping`` when a config leaves it out: 0.0 until PR 8068 (commit 442166559, first in v0.19.3)
    # made it 1.0 (runtime/constants.py GRADIENT_CLIPPING_DEFAULT).
    default_gradient_clipping: float
    # ZeRO-3 offload ``partition_grads``: ``fp32_grad_tensor.copy_(...)`` without ``non_blocking`` (the host
    # waits for every parameter's fp32 copy) until PR 8207 (commit 7dfa67aea, first in v0.19.5), which issues
    # it non-blocking; the same PR made ``offload_optimizer/offload_param.pin_memory`` default True (False
    # before: runtime/zero/offload_config.py).
    zero3_blocking_grad_copy: bool
    default_pin_memory: bool
    # ZeRO-1/2 ``unscale_and_clip_grads`` (stage_1_and_2.py): 0.19.8 returns at once when clip_grad == 0 and
    # loss_scale == 1; 0.18.0-0.19.5 always run the ``mul_`` pass over the fp32 partition (not in the git
    # history up to v0.19.5-27-gedaa72212; present in the 0.19.8 sources).
    zero2_unscale_always: bool
    # DeepSpeedCPUAdam on aarch64 (op_builder/builder.py ``simd_width``): scalar (-D__SCALAR__) up to
    # v0.19.5; 0.19.8 builds the SVE kernel on an SVE CPU such as Grace (PR 8365; PR 8453 adds NEON for Arm
    # CPUs without SVE, not Grace).
    cpu_adam_sve: bool


def version_tuple(sc: Scenario) -> Version:
    return parse(sc.schedule.deepspeed_version)


def behaviour_of(v: Version) -> DsBehaviour:
    return DsBehaviour(
        version=fmt(v),
        superoffload_release_path=v < (0, 18, 9),
        default_gradient_clipping=1.0 if v >= (0, 19, 3) else 0.0,
        zero3_blocking_grad_copy=v < (0, 19, 5),
        default_pin_memory=v >= (0, 19, 5),
        zero2_unscale_always=v < (0, 19, 8),
        cpu_adam_sve=v >= (0, 19, 8),
    )


def behaviour(sc: Scenario) -> DsBehaviour:
    return behaviour_of(version_tuple(sc))


def adam_impl(sc: Scenario, impl: AdamImpl) -> AdamImpl:
    """The CPU Adam a DeepSpeed preset runs: ``cpu_adam`` is DeepSpeedCPUAdam as the version builds it. On a
    profile with an SVE CPU (a ``cpu_adam_sve`` curve) 0.19.8 runs the SVE kernel; earlier releases the scalar
    build (the profile's ``cpu_adam`` curve). x86 profiles have no SVE curve: their AVX build is every
    release's."""
    if impl == "cpu_adam" and behaviour(sc).cpu_adam_sve and "cpu_adam_sve" in sc.hardware.cpu.adam_s_by_gparams:
        return "cpu_adam_sve"
    return impl


def describe(sc: Scenario) -> dict[str, str]:
    """Provenance lines: the version and what it changes on this run's path."""
    b = behaviour(sc)
    impl = getattr(sc.schedule, "implementation", "deepspeed")
    if impl != "deepspeed":
        return {"deepspeed_version": f"{b.version} (not used: implementation {impl} is the paper's schedule)"}
    notes = [
        "SuperOffload as released (PR 7559)" if b.superoffload_release_path else "SuperOffload after PR 7906",
        "ZeRO-3 fp32 grad copy blocking (before PR 8207)" if b.zero3_blocking_grad_copy
        else "ZeRO-3 fp32 grad copy non-blocking (PR 8207)",
        "CPUAdam SVE on aarch64 (PR 8365)" if b.cpu_adam_sve else "CPUAdam scalar on aarch64",
    ]
    return {"deepspeed_version": b.version, "deepspeed_version_paths": "; ".join(notes)}
