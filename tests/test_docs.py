"""The docs cannot drift from the code: every registered system and each of its knobs is in
docs/scenarios.md, and the number of notebooks the docs state is the number in notebooks/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sosim.schedules.registry import SYSTEMS

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS_MD = ROOT / "docs" / "scenarios.md"
# The knob table's wording for "every system but gpu_only and zero3" (docs/scenarios.md says so above it).
OFFLOAD_SYSTEMS = "offload systems"
NOT_OFFLOAD = ("gpu_only", "zero3")
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
           "ten": 10}
NOTEBOOK_COUNT = re.compile(r"\b(" + "|".join(NUMBERS) + r"|\d+)\s+(?:short\s+)?(?:studies|notebooks)\b", re.I)


def _table_rows(text: str, header: str) -> dict[str, list[str]]:
    """The rows of the markdown table whose header line starts with ``header``, keyed by the first cell
    without its backticks."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def _names(cell: str, system: str) -> bool:
    """Whether a table cell covers ``system``: named as a whole word, or as one of the offload systems."""
    if re.search(rf"(?<![\w-]){re.escape(system)}(?![\w-])", cell):
        return True
    return OFFLOAD_SYSTEMS in cell.lower() and system not in NOT_OFFLOAD


def _knobs(system: str) -> list[str]:
    return [name for name in SYSTEMS[system].knobs.model_fields if name != "system"]


def test_every_system_is_in_the_systems_table() -> None:
    rows = _table_rows(SCENARIOS_MD.read_text(), "| system |")
    missing = [name for name in SYSTEMS if name not in rows]
    assert not missing, f"docs/scenarios.md, table 'Systems': add {missing}"
    stale = [name for name in rows if name not in SYSTEMS]
    assert not stale, f"docs/scenarios.md, table 'Systems': {stale} are not in sosim/schedules/registry.py"


@pytest.mark.parametrize("system", list(SYSTEMS))
def test_every_knob_of_a_system_is_in_the_knob_table_for_that_system(system: str) -> None:
    rows = _table_rows(SCENARIOS_MD.read_text(), "| knob |")
    missing = [knob for knob in _knobs(system) if knob not in rows]
    assert not missing, f"docs/scenarios.md, table 'Schedule knobs': add {missing} ({system})"
    not_listed = [knob for knob in _knobs(system) if not _names(rows[knob][0], system)]
    assert not not_listed, f"docs/scenarios.md, table 'Schedule knobs': the rows of {not_listed} do not name {system}"


def test_the_knob_table_has_no_knob_the_code_lacks() -> None:
    rows = _table_rows(SCENARIOS_MD.read_text(), "| knob |")
    known = {knob for system in SYSTEMS for knob in _knobs(system)}
    assert not set(rows) - known, f"docs/scenarios.md documents knobs no system has: {sorted(set(rows) - known)}"


def _current_docs() -> list[Path]:
    """The README and the reference pages (docs/history/ records what was true then, and may say otherwise)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_notebook_count_the_docs_state_is_the_notebooks_folder() -> None:
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    stated = [(path.relative_to(ROOT), m.group(0)) for path in _current_docs()
              for m in NOTEBOOK_COUNT.finditer(path.read_text())]
    assert stated, "no page states how many notebooks there are (docs/usage.md should)"
    def count(phrase: str) -> int:
        word = phrase.split()[0].lower()
        return int(word) if word.isdigit() else NUMBERS[word]

    wrong = [(str(path), phrase) for path, phrase in stated if count(phrase) != len(notebooks)]
    assert not wrong, f"{len(notebooks)} notebooks in notebooks/, but the docs say: {wrong}"


def test_every_notebook_is_described_in_usage() -> None:
    usage = (ROOT / "docs" / "usage.md").read_text()
    missing = [nb.name for nb in (ROOT / "notebooks").glob("*.ipynb") if nb.name not in usage]
    assert not missing, f"docs/usage.md, section 'Notebooks': describe {missing}"


def test_every_doc_page_is_in_the_docs_index() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    missing = [p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md" and p.name not in index]
    missing += [f"history/{p.name}" for p in (ROOT / "docs" / "history").glob("*.md")
                if f"history/{p.name}" not in index]
    assert not missing, f"docs/README.md: link {missing}"


def test_every_reference_row_out_of_budget_is_explained() -> None:
    """docs/validation.md's generated table of reference rows is regenerated from the model; every row it marks
    out of budget must be named, with its reason, in the hand-written section on misses."""
    text = (ROOT / "docs" / "validation.md").read_text()
    table = text[text.index("<!-- generated:references -->"):text.index("<!-- /generated:references -->")]
    misses = [line.split("|")[1].strip() for line in table.splitlines()
              if line.startswith("|") and line.rstrip().endswith("| **no** |")]
    prose = text[text.index("## What matches, what misses, and why"):]
    unexplained = [row for row in misses if f"`{row}`" not in prose]
    assert not unexplained, f"docs/validation.md, 'What matches, what misses, and why': explain {unexplained}"


def test_history_pages_cite_only_what_a_user_can_open() -> None:
    """docs/history/ ships with the docs: like the reference pages (tests/test_packaging.py), it must not send
    a user to the project-internal notes."""
    internal = re.compile(r"\b(REFERENCE|DESIGN|KINDS|H200)\.md\b")
    offending = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "docs" / "history").glob("*.md"))
                 for i, line in enumerate(p.read_text().splitlines(), 1) if internal.search(line)]
    assert not offending, offending


def test_every_scenario_and_profile_key_is_in_the_reference() -> None:
    """Each key of the scenario's model / training / cluster sections and of the hardware profile's sections
    is named in docs/scenarios.md (the schema is in sosim/inputs/config.py)."""
    from sosim.inputs import config

    text = SCENARIOS_MD.read_text()
    models = [config.Scenario, config.ModelSpec, config.TrainingSpec, config.ClusterSpec, config.HardwareProfile,
              config.GpuSpec, config.CpuSpec, config.LinkSpec, config.NodeSpec, config.UplinkSpec,
              config.SocketLinkSpec, config.FabricSpec, config.NicSpec, config.NvmeSpec, config.NetworkSpec,
              config.InterconnectSpec, config.LeaseSpread]
    missing = [f"{m.__name__}.{name}" for m in models for name in m.model_fields
               if not re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text)]
    assert not missing, f"docs/scenarios.md does not name {missing}"


def test_every_system_has_a_row_in_the_model_page() -> None:
    text = (ROOT / "docs" / "model.md").read_text()
    missing = [name for name in SYSTEMS if f"| `{name}` |" not in text]
    assert not missing, f"docs/model.md, table of systems under 'Systems from blocks': add {missing}"
