"""docs/knobs.md is written from the knob models (sosim/formats/knob_docs.py): it must be what the code says now,
and every knob of every registered system must say what it is."""

from __future__ import annotations

from typing import Literal

import pytest

from sosim.formats import knob_docs
from sosim.inputs.config import ScheduleKnobs
from sosim.schedules.registry import SYSTEMS


def test_the_knob_page_is_what_the_code_says() -> None:
    on_disk = knob_docs.DOC_PATH.read_text(encoding="utf-8")
    assert on_disk == knob_docs.render(), (
        f"docs/knobs.md is stale (a knob, its default or its description changed): run `{knob_docs.REGENERATE}`")


@pytest.mark.parametrize("system", list(SYSTEMS))
def test_every_knob_is_described_and_on_the_page(system: str) -> None:
    knobs = SYSTEMS[system].knobs
    page = knob_docs.render()
    section = page.split(f"## `{system}` ", 1)[1].split("\n## ", 1)[0]
    for name, info in knobs.model_fields.items():
        if name == "system":
            continue
        assert info.description, f"{knobs.__name__}.{name}: no Field(description=...)"
        assert f"| `{name}` |" in section, (system, name)


def test_defaults_follow_the_implementation() -> None:
    """Hand-read from the presets: superoffload's DEFAULTS (DeepSpeed's 1e9 sub-groups and CPU cast, the paper's 6e8
    and GPU cast), the deepspeed column first (the knob's default)."""
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ") for line in knob_docs.system_table("superoffload")
            if line.startswith("| `")}
    header = knob_docs.system_table("superoffload")[2]
    assert header.startswith("| knob | values | default (deepspeed) | default (ideal)")
    assert rows["sub_group_elements"][2:4] == ["1e9", "6e8"]
    assert rows["cast"][1:4] == ["`gpu` / `cpu`", "cpu", "gpu"]
    assert rows["gpu_optimizer_fraction"][1] == "float >= 0, <= 1"


def test_a_knob_without_a_description_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    class Bare(ScheduleKnobs):
        system: Literal["bare"]
        width: int = 3

    from sosim.schedules import registry

    monkeypatch.setitem(registry._REGISTERED, "bare", SYSTEMS["gpu_only"]._replace(knobs=Bare))
    with pytest.raises(ValueError, match=r"Bare\.width: no Field\(description"):
        knob_docs.system_table("bare")
