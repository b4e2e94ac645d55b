"""DeepSpeed's host-side costs on a host other than the one they were measured on (Grace, issue 16).

The analytic fallbacks of :mod:`sosim.costs.analytic` for DeepSpeed's stage-3 and SuperOffload paths were measured on,
or estimated for, the x86 H200 machine (a 16-vCPU VM, 4 KiB pages, ~105 GB/s DRAM). Carried unchanged to a
72-core Grace they would claim that Grace runs DeepSpeed's Python exactly as fast as that VM and faults its
pages at x86's page size. Instead each cost moves with what governs it:

* **Python on the training process's host thread** (ZeRO-3 module hooks per parameter tensor, ``step()``'s
  per-sub-group bookkeeping, SuperOffload's worker queue messages): divided by ``cpu.host_thread_speed``, the
  host thread's speed on these paths relative to the VM's core (1.0 there). For Grace it is 1.0 too, an
  assumption written in the profile's ``sources`` (no published comparison; docs/gh200.md "Host thread").
* **First touch of a freshly allocated host buffer** (the temporary DeepSpeed's stage-3 refresh ``copy_``
  casts into): one page fault per page, a fixed fault cost plus zeroing the page, so ``cpu.page_kib`` sets the
  rate: 4 KiB pages on the x86 VM, 64 KiB on the kernels NVIDIA recommends for Grace.
* **Memory-bound passes** (norm, unscale, the worker's copies, casts) already scale with ``cpu.mem_GBps`` and
  ``cpu.cast_GBps`` in :mod:`sosim.costs.analytic`; nothing to do here.

The host sync (:data:`sosim.costs.analytic.HOST_SYNC_S`) is the GPU's queue draining, not host work: not scaled.
"""

from __future__ import annotations

from sosim.inputs.config import CpuSpec

# The host the x86 constants of sosim.costs.analytic describe (hardware_profiles/h200-pcie-gen5-x86.yaml): 4 KiB pages,
# and its first-touch rate, ~1.5 us per 4 KiB page on one core (sosim.costs.analytic.FIRST_TOUCH_GBps_PER_CORE, an
# estimate: Linux anonymous page faults including zeroing).
REFERENCE_PAGE_KIB = 4.0
REFERENCE_FIRST_TOUCH_GBps_PER_CORE = 2.7
# One core clearing a fresh page (clear_page: a streaming store loop). Estimate; the rest of the reference
# page's 1.5 us is the fault's fixed cost (trap, page-table update, mapping), the same whatever the page size.
PAGE_ZERO_GBps_PER_CORE = 8.2
_REF_PAGE_BYTES = REFERENCE_PAGE_KIB * 1024.0
FAULT_OVERHEAD_S = (_REF_PAGE_BYTES / (REFERENCE_FIRST_TOUCH_GBps_PER_CORE * 1e9)
                    - _REF_PAGE_BYTES / (PAGE_ZERO_GBps_PER_CORE * 1e9))


def first_touch_GBps_per_core(cpu: CpuSpec) -> float:
    """GB/s one core writes into freshly mapped pages: page size / (fault overhead + zeroing the page)."""
    page_bytes = cpu.page_kib * 1024.0
    return page_bytes / (FAULT_OVERHEAD_S + page_bytes / (PAGE_ZERO_GBps_PER_CORE * 1e9)) / 1e9


def host_thread_s(reference_s: float, cpu: CpuSpec) -> float:
    """A Python host-thread cost measured (or estimated) on the x86 VM, on this profile's host thread."""
    return reference_s / cpu.host_thread_speed


def transferred_note(cpu: CpuSpec) -> str:
    """What this module moved for ``cpu`` (empty when it is the reference host: nothing is transferred).

    A host other than the reference one (another page size, or another host-thread speed) carries the VM's
    host-thread costs even at ``host_thread_speed`` 1.0: they are then the VM's values taken unchanged, which is
    still a transfer, and the note says so."""
    other_host = cpu.host_thread_speed != 1.0 or cpu.page_kib != REFERENCE_PAGE_KIB
    if not other_host:
        return ""
    parts = [f"stage3_hook, ds_step_fixed bookkeeping, so_worker queue: x86 VM value / host_thread_speed "
             f"{cpu.host_thread_speed:g}"]
    if cpu.page_kib != REFERENCE_PAGE_KIB:
        parts.append(f"ds_refresh first touch: {cpu.page_kib:g} KiB pages = "
                     f"{first_touch_GBps_per_core(cpu):.1f} GB/s per core (x86 VM: "
                     f"{REFERENCE_PAGE_KIB:g} KiB, {REFERENCE_FIRST_TOUCH_GBps_PER_CORE:g} GB/s)")
    return "; ".join(parts)
