from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# CI (CI=true) runs the property tests derandomized: a red CI run then means a change broke something, not that
# a new random draw found an old corner; the random search runs on every developer's machine (and `--slow`).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/*.csv from the model")
    parser.addoption("--benchmark", action="store_true", help="run speed benchmarks (marker 'benchmark')")
    parser.addoption("--slow", action="store_true", help="run long tests (marker 'slow'), e.g. the full fuzz run")
    parser.addoption("--device", action="store_true",
                     help="run the calibration-harness tests that need torch or DeepSpeed (marker 'device')")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The README's test command stays fast and needs no torch; CI runs each marked group on its own (.ci/run).
    for marker, option in (("benchmark", "--benchmark"), ("slow", "--slow"), ("device", "--device")):
        if config.getoption(option):
            continue
        skip = pytest.mark.skip(reason=f"{marker}: run with {option}")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def root() -> Path:
    return ROOT
