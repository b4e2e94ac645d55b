"""Which DeepSpeed releases sosim models (the input side; what each one does: sosim/schedules/blocks/ds_version.py).

A scenario says which DeepSpeed it runs with ``schedule.deepspeed_version`` (default: the newest modelled);
``sosim run --ds-config`` takes ``--ds-version``. The ranges below are the releases whose code was read for
the paths sosim replays (SuperOffload, ZeRO-3 offload, ZeRO-2 offload, ZeRO-3 hooks, CPUAdam): the tagged
sources of 0.18.0, 0.18.8 and 0.19.8, and DeepSpeed's git history (deepspeedai/DeepSpeed, tags v0.18.0 to
v0.19.5) between them. A version outside them is an input error that lists them; a range is left out where a
change on these paths is known but not modelled (its reason beside it).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

Version = tuple[int, int, int]

# (first, last, label): every release inside a range is modelled. Kept in release order.
MODELLED: tuple[tuple[Version, Version, str], ...] = (
    ((0, 18, 0), (0, 18, 4), "SuperOffload as released (PR 7559)"),
    ((0, 18, 7), (0, 18, 8), "SuperOffload as released (PR 7559); PR 7886's hook-count fix"),
    ((0, 18, 9), (0, 19, 5), "PR 7906's SuperOffload (shared CPU buffers, refresh); 0.19.3: PR 8068 clipping 1.0; "
                             "0.19.5: PR 8207 async ZeRO-3 gradient offload"),
    ((0, 19, 8), (0, 19, 8), "SVE CPUAdam (PR 8365), ZeRO-2 unscale skipped without clipping"),
)
# Releases inside the modelled era that are left out, and why (the message says it).
NOT_MODELLED: tuple[tuple[Version, Version, str], ...] = (
    ((0, 18, 5), (0, 18, 6), "PR 7780 (in 0.18.5) counts the used parameters inside every gradient hook, an "
                             "O(tensors) cost per hook that PR 7886 removed in 0.18.7; sosim does not model it"),
    ((0, 19, 6), (0, 19, 7), "their sources were not read: PR 8365 (SVE CPUAdam), ZeRO-2's unscale early return "
                             "and the SuperOffload worker's pin_memory landed between v0.19.5 and 0.19.8 at "
                             "releases sosim cannot place"),
)
NEWEST = "0.19.8"


def parse(text: str) -> Version:
    """``"0.18.8"`` -> (0, 18, 8); a ValueError naming the modelled ranges otherwise."""
    parts = str(text).strip().removeprefix("v").split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{text!r} is not a DeepSpeed release (MAJOR.MINOR.PATCH); {modelled_text()}")
    return int(parts[0]), int(parts[1]), int(parts[2])


def fmt(v: Version) -> str:
    return ".".join(map(str, v))


def modelled_text() -> str:
    ranges = ", ".join(fmt(a) if a == b else f"{fmt(a)}-{fmt(b)}" for a, b, _ in MODELLED)
    return f"modelled DeepSpeed versions: {ranges}"


def check(text: str) -> str:
    """The normalised version string, or a ValueError saying why it is not modelled and which are."""
    v = parse(text)
    for a, b, why in NOT_MODELLED:
        if a <= v <= b:
            raise ValueError(f"DeepSpeed {fmt(v)} is not modelled: {why}; {modelled_text()}")
    if not any(a <= v <= b for a, b, _ in MODELLED):
        raise ValueError(f"DeepSpeed {fmt(v)} is outside the modelled versions; {modelled_text()}")
    return fmt(v)


# The scenario key's type: a modelled release, normalised ("v0.18.8" -> "0.18.8").
DeepSpeedVersion = Annotated[str, AfterValidator(check)]
