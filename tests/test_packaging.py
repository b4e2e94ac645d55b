"""What ships: the data folders the wheel carries (setup.py), how sosim finds them (sosim/inputs/resources.py), and
that shipped files cite only what a user can open.

The full check (build the wheel, install it into a clean virtual environment, run shipped examples from
another folder) is in .ci/run; ``test_wheel_carries_the_data`` (``--slow``, needs the package index for the
isolated build) builds the wheel and looks inside; ``test_installed_wheel_validates_what_the_checkout_does``
installs it (``--no-deps``, into a target folder on top of this environment's dependencies) and runs
``sosim validate`` from an empty folder.
"""

from __future__ import annotations

import ast
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sosim.inputs.resources import data_root, example_scenarios, find_example, shipped_profiles_dir
from sosim.inputs.resources import shipped as shipped_file
from sosim.run.loader import load_profile, read_yaml

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
    model = "scenarios/deepspeed/models/llama-3-8b.json"
    assert shipped_file(model) == ROOT / model


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
    # What the notebooks read ships too: they name it through sosim.inputs.resources.shipped("scenarios/x.yaml"), which
    # finds it in a checkout and in an installed sosim alike, never as "../scenarios/x.yaml" (checkout only).
    named = re.compile(r"""shipped\(["']((?:{})/[^"']+)["']\)""".format("|".join(dirs)))
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        code = "\n".join("".join(cell["source"]) for cell in json.loads(notebook.read_text())["cells"]
                         if cell["cell_type"] == "code")
        assert "../" not in code, f"{notebook.name} reads a path relative to the checkout"
        for rel in named.findall(code):
            path = ROOT / rel
            # A folder (a calibration run) ships when the files in it do.
            files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
            assert files and all(shipped(f) for f in files if f.suffix in suffixes), f"{notebook.name}: {rel}"
            assert any(shipped(f) for f in files), f"{notebook.name}: {rel}"


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
    wheel = _build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    for profile in (ROOT / "hardware_profiles").glob("*.yaml"):
        assert f"sosim/_data/hardware_profiles/{profile.name}" in names
    for scenario in (ROOT / "scenarios").rglob("*.yaml"):
        assert f"sosim/_data/{scenario.relative_to(ROOT)}" in names
    assert "sosim/_data/validation/references.yaml" in names
    assert "sosim/_data/calibration/nvidia-h200-2026-11-29/measurements.csv" in names
    assert "sosim/_data/calibration/nvidia-h200-2026-11-30/measurements.csv" in names


def _build_wheel(out: Path) -> Path:
    """The wheel of a copy of the checkout (pip builds in the source tree: a copy keeps build/ out of the
    checkout, and a file deleted from the checkout cannot linger in a reused build/lib)."""
    src = out / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_data", "*.egg-info")
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy2(ROOT / name, src / name)
    data_dirs = _setup_constants()["DATA_DIRS"]
    assert isinstance(data_dirs, tuple)
    for folder in ("sosim", *data_dirs):
        shutil.copytree(ROOT / folder, src / folder, ignore=ignore)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-w", str(out / "dist"), "-q"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot build the wheel here (isolated build needs the package index): {proc.stderr[-300:]}")
    (wheel,) = (out / "dist").glob("sosim-*.whl")
    return wheel


def _validate_json(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([*cmd, "validate", "--format", "json", "--band-replays", "0"], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _json_of(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode in (0, 1), err  # 1: a row outside its budget is a result; 2 is an input error
    data = json.loads(out)
    assert isinstance(data, dict)
    return data


# Slow (builds and installs a wheel, ~15 s): .ci/run's wheel step checks the same row counts on every run.
@pytest.mark.slow
def test_installed_wheel_validates_what_the_checkout_does(tmp_path: Path) -> None:
    """Issue 15: from an installed wheel, run outside the checkout, ``sosim validate`` checks as many published
    rows and measured runs as the checkout does (it once checked 0 measured runs, silently)."""
    wheel = _build_wheel(tmp_path)
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q", "--target",
                           str(site), str(wheel)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    away = tmp_path / "away"
    away.mkdir()
    # The installed copy first on the path (ahead of this environment's editable install of the checkout); the
    # dependencies come from this environment. The entry-point script pip wrote is what a user runs.
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}
    env.pop("SOSIM_PROFILES", None)
    # Both at once (each is one process; the machine has two cores).
    from_wheel = _validate_json([sys.executable, str(site / "bin" / "sosim")], away, env)
    from_checkout = _validate_json([sys.executable, "-m", "sosim"], away, {**env, "PYTHONPATH": str(ROOT)})
    installed, checkout = _json_of(from_wheel), _json_of(from_checkout)

    assert installed["data"] == str(site / "sosim" / "_data"), installed["data"]
    assert checkout["data"] == str(ROOT)
    counts = installed["checked"]
    assert counts == checkout["checked"], (counts, checkout["checked"])
    assert isinstance(counts, dict) and counts["measured"] > 0
    assert counts["published"] == len(read_yaml(ROOT / "validation/references.yaml").data["rows"])
    shipped_runs = 0
    for steps in (ROOT / "calibration").glob("*/deepspeed_steps.csv"):
        with steps.open() as f:
            shipped_runs += len({row["run_id"] for row in csv.DictReader(f)})
    assert counts["measured"] + counts["measured_skipped"] == shipped_runs


def test_the_version_is_said_once_and_matches_pyproject() -> None:
    """sosim.__version__ (and check baselines' `sosim` field) come from sosim/inputs/version.py; the wheel's metadata
    from pyproject.toml: the two must agree."""
    import tomllib

    import sosim
    from sosim.inputs.version import VERSION

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    assert sosim.__version__ == VERSION == project["version"]
