"""Where the files that ship with sosim live: hardware profiles, example scenarios, validation references and
the calibration tables the profiles point at.

In a checkout they are the repository's top-level folders (``hardware_profiles/``, ``scenarios/``,
``validation/``, ``calibration/``). An installed wheel carries copies of the same folders, with the same
relative layout, as package data under ``sosim/_data/`` (``setup.py`` copies them at build time), so a
profile's ``calibration: ../calibration/...`` and a sweep's ``base: ../x.yaml`` resolve the same way in both.
The installed copy is found through :mod:`importlib.resources`; nothing here reads or writes anything.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

# Folder names shared by the repository layout and the installed package data.
PROFILES_DIR = "hardware_profiles"
SCENARIOS_DIR = "scenarios"
VALIDATION_DIR = "validation"
CALIBRATION_DIR = "calibration"
PACKAGE_DATA = "_data"


def data_root() -> Path:
    """The folder holding the shipped data folders: ``sosim/_data`` when installed, else the checkout root."""
    # files() of a regular package is a pathlib.Path for a normal (unzipped) install.
    installed = Path(str(files("sosim"))) / PACKAGE_DATA
    if (installed / PROFILES_DIR).is_dir():
        return installed
    return Path(__file__).resolve().parents[2]  # sosim/inputs/resources.py -> the checkout


def shipped_profiles_dir() -> Path:
    return data_root() / PROFILES_DIR


def shipped_scenarios_dir() -> Path:
    return data_root() / SCENARIOS_DIR


def shipped(relative: str) -> Path:
    """A shipped file by its path in the repository layout (``scenarios/deepspeed/models/llama-3-8b.json``),
    in a checkout or an installed wheel alike: what a notebook or script should use instead of ``../scenarios/``,
    which only resolves from inside a checkout."""
    return data_root() / relative


def shipped_calibration_dir() -> Path:
    """The shipped calibration folders (``calibration/<machine>/``: tables, measured DeepSpeed runs)."""
    return data_root() / CALIBRATION_DIR


def default_references() -> Path:
    return data_root() / VALIDATION_DIR / "references.yaml"


def example_scenarios() -> dict[str, Path]:
    """Shipped example name -> file: scenarios by their stem, sweep files as ``sweeps/<stem>``."""
    root = shipped_scenarios_dir()
    found: dict[str, Path] = {}
    if root.is_dir():
        for f in sorted(root.glob("*.yaml")):
            found[f.stem] = f
        for f in sorted(root.glob("sweeps/*.yaml")):
            found[f"sweeps/{f.stem}"] = f
    return found


def find_example(name: str) -> Path | None:
    """A shipped example by name (``gh200_zero_offload_4b``, ``sweeps/gh200_zero_offload_buckets``; a
    ``.yaml`` suffix and a leading ``scenarios/`` are accepted), or None."""
    key = name.removeprefix(f"{SCENARIOS_DIR}/").removesuffix(".yaml").removesuffix(".yml")
    examples = example_scenarios()
    if key in examples:
        return examples[key]
    return examples.get(f"sweeps/{key}")
