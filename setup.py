"""Build step for the wheel: the repository's data folders travel inside the package.

Hardware profiles, example scenarios, validation references and calibration tables live at the top of the
repository (``hardware_profiles/``, ``scenarios/``, ``validation/``, ``calibration/``). A wheel can only
carry files inside its packages, so ``build_py`` copies these folders, keeping their relative layout, to
``sosim/_data/``, where :mod:`sosim.inputs.resources` finds them through importlib.resources. The project's
metadata is in ``pyproject.toml``; this file only adds the copy.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA_DIRS = ("hardware_profiles", "scenarios", "validation", "calibration")
DATA_SUFFIXES = {".yaml", ".yml", ".csv", ".json", ".md", ".txt", ".log", ".toml"}  # .toml: torchtitan jobs
HERE = Path(__file__).resolve().parent


class BuildPyWithData(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the folders in the checkout directly
        target = Path(self.build_lib) / "sosim" / "_data"
        for name in DATA_DIRS:
            for src in sorted((HERE / name).rglob("*")):
                if src.is_file() and src.suffix in DATA_SUFFIXES:
                    dst = target / src.relative_to(HERE)
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    self.copy_file(str(src), str(dst))


setup(cmdclass={"build_py": BuildPyWithData})
