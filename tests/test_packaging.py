"""What ships: the data folders the wheel carries (setup.py), how sosim finds them (sosim/resources.py), and
that shipped files cite only what a user can open.

The full check (build the wheel, install it into a clean virtual environment, run shipped examples from
another folder) is in .ci/run; ``test_wheel_carries_the_data`` (``--slow``, needs the package index for the
isolated build) builds the wheel and looks inside.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sosim.loader import load_profile, read_yaml
from sosim.resources import data_root, example_scenarios, find_example, shipped_profiles_dir

ROOT = Path(__file__).resolve().parent.parent


def _setup_constants() -> dict[str, object]:
    """DATA_DIRS and DATA_SUFFIXES as setup.py states them (read, not imported: importing runs setup())."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("DATA_DIRS", "DATA_SUFFIXES"):
                found[name] = ast.literal_eval(node.value)
    return found


def test_checkout_reads_the_top_level_folders() -> None:
    assert data_root() == ROOT
    assert shipped_profiles_dir() == ROOT / "hardware_profiles"


def test_examples_by_name() -> None:
    examples = example_scenarios()
    assert set(examples) >= {p.stem for p in (ROOT / "scenarios").glob("*.yaml")}
    assert examples["sweeps/gh200_zero_offload_buckets"] == ROOT / "scenarios/sweeps/gh200_zero_offload_buckets.yaml"
    for name in ("gh200_zero_offload_4b", "gh200_zero_offload_4b.yaml", "scenarios/gh200_zero_offload_4b.yaml"):
        assert find_example(name) == ROOT / "scenarios/gh200_zero_offload_4b.yaml"
    assert find_example("gh200_zero_offload_buckets") == examples["sweeps/gh200_zero_offload_buckets"]
    assert find_example("no_such_example") is None


def test_everything_the_shipped_files_point_at_is_shipped() -> None:
    """Calibration tables named by profiles, scenarios named by validation rows and sweep bases: each lies in
    a folder setup.py copies, with a suffix it copies, so the installed package finds it."""
    consts = _setup_constants()
    dirs, suffixes = consts["DATA_DIRS"], consts["DATA_SUFFIXES"]
    assert isinstance(dirs, tuple) and isinstance(suffixes, set)

    def shipped(path: Path) -> bool:
        rel = path.resolve().relative_to(ROOT)
        return rel.parts[0] in dirs and path.suffix in suffixes and path.is_file()

    for profile in sorted(shipped_profiles_dir().glob("*.yaml")):
        for cal in load_profile(profile).calibration_paths:
            assert shipped(Path(cal)), f"{profile.name}: {cal}"
    rows = read_yaml(ROOT / "validation/references.yaml").data["rows"]
    for row in rows:
        assert shipped(ROOT / row["scenario"]), row["id"]
    for sweep in (ROOT / "scenarios/sweeps").glob("*.yaml"):
        assert shipped(sweep.parent / read_yaml(sweep).data["base"])


NOT_SHIPPED = re.compile(r"\b(REFERENCE|DESIGN|KINDS|H200)\.md\b")


def test_shipped_files_cite_only_what_a_user_can_open() -> None:
    """Project-internal notes (REFERENCE.md, DESIGN.md, device notes) are not in the repository or the
    wheel: profiles, references, scenarios, docs and the README must not send a user to them."""
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "notebooks").glob("*.ipynb"),
             *(ROOT / "sosim").rglob("*.py")]
    for folder in ("hardware_profiles", "scenarios", "validation"):
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file()]
    offending = [f"{f.relative_to(ROOT)}:{i}: {line.strip()[:80]}"
                 for f in files for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1)
                 if NOT_SHIPPED.search(line)]
    assert not offending, "\n".join(offending)


@pytest.mark.slow
def test_wheel_carries_the_data(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-w", str(tmp_path), "-q"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot build the wheel here (isolated build needs the package index): {proc.stderr[-300:]}")
    (wheel,) = tmp_path.glob("sosim-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for profile in (ROOT / "hardware_profiles").glob("*.yaml"):
        assert f"sosim/_data/hardware_profiles/{profile.name}" in names
    for scenario in (ROOT / "scenarios").rglob("*.yaml"):
        assert f"sosim/_data/{scenario.relative_to(ROOT)}" in names
    assert "sosim/_data/validation/references.yaml" in names
    assert "sosim/_data/calibration/nvidia-h200-2026-11-29/measurements.csv" in names
    assert "sosim/_data/calibration/nvidia-h200-2026-11-30/measurements.csv" in names
