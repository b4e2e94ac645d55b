"""YAML files and ``--set`` overrides -> validated :class:`~sosim.config.Scenario`.

Every problem is reported as ``file:line: key.path: message``, all problems of a file at once, so that a
user fixes a scenario in one pass. Line numbers come from PyYAML's node marks, kept in a side table keyed
by the key path; pydantic's error locations are mapped back through it.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sosim.config import HardwareProfile, Scenario
from sosim.errors import ConfigError
from sosim.schedules.registry import SYSTEM_NAMES

KeyPath = tuple[str | int, ...]
# libyaml's loader when PyYAML was built with it (several times faster), else the pure-Python one.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Profiles ship beside the package in the repository (the layout the user asked for); SOSIM_PROFILE_PATH
# (os.pathsep-separated folders) adds more.
_REPO_PROFILES = Path(__file__).resolve().parent.parent / "hardware_profiles"


@dataclass
class Located:
    """A parsed YAML document plus where each key path came from."""

    data: Any
    origin: str  # file name shown in messages
    # key path -> (file, line); a scenario's hardware keys point into the profile file.
    lines: dict[KeyPath, tuple[str, int]] = field(default_factory=dict)
    # Key paths set by --set: reported as the override, not as a line of the file.
    overridden: dict[KeyPath, str] = field(default_factory=dict)

    def where(self, path: KeyPath) -> str:
        """Best location for a key path: the override that set it, or the nearest line in the file."""
        for i in range(len(path), -1, -1):
            prefix = path[:i]
            if prefix in self.overridden:
                return f"--set {self.overridden[prefix]}"
            if prefix in self.lines:
                origin, line = self.lines[prefix]
                return f"{origin}:{line}"
        return f"{self.origin}:1"


def _index_lines(node: yaml.Node, path: KeyPath, origin: str, lines: dict[KeyPath, tuple[str, int]]) -> None:
    lines.setdefault(path, (origin, node.start_mark.line + 1))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            lines[(*path, key)] = (origin, key_node.start_mark.line + 1)
            _index_lines(value_node, (*path, key), origin, lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, (*path, i), origin, lines)


def parse_yaml(text: str, origin: str) -> Located:
    """Parse YAML text keeping line numbers; syntax errors become a ConfigError with the line."""
    try:
        # One parse: compose the node tree (it carries the line marks), then construct Python data from it.
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else 1
        raise ConfigError([f"{origin}:{line}: YAML syntax error: {exc.problem}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{origin}:1: YAML error: {exc}"]) from None
    lines: dict[KeyPath, tuple[str, int]] = {}
    if node is not None:
        _index_lines(node, (), origin, lines)
    return Located(data=data if data is not None else {}, origin=origin, lines=lines)


def read_yaml(path: str | Path) -> Located:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read file: {exc.strerror or exc}"]) from None
    return parse_yaml(text, str(p))


def profile_dirs() -> list[Path]:
    extra = [Path(d) for d in os.environ.get("SOSIM_PROFILE_PATH", "").split(os.pathsep) if d]
    return [*extra, _REPO_PROFILES]


def available_profiles() -> dict[str, Path]:
    """Profile name -> file, first folder wins (so SOSIM_PROFILE_PATH can shadow a shipped profile)."""
    found: dict[str, Path] = {}
    for folder in profile_dirs():
        if folder.is_dir():
            for f in sorted(folder.glob("*.yaml")):
                found.setdefault(f.stem, f)
    return found


def resolve_profile_path(ref: str, relative_to: Path | None) -> Path:
    candidates = []
    if relative_to is not None:
        candidates.append(relative_to / ref)
    candidates.append(Path(ref))
    for c in candidates:
        if c.suffix in (".yaml", ".yml") and c.is_file():
            return c
    known = available_profiles()
    if ref in known:
        return known[ref]
    raise KeyError(ref)


def parse_override(text: str) -> tuple[KeyPath, Any]:
    """``a.b.c=value`` -> (("a","b","c"), parsed value). The value is parsed as YAML (numbers, lists...)."""
    if "=" not in text:
        raise ConfigError([f"--set {text}: expected key.path=value"])
    key, _, raw = text.partition("=")
    parts = key.strip().split(".")
    if not key.strip() or any(not p for p in parts):
        raise ConfigError([f"--set {text}: empty key in '{key}'"])
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    path: KeyPath = tuple(int(p) if p.isdigit() else p for p in parts)
    return path, value


def _set_path(data: dict[str, Any], path: KeyPath, value: Any, text: str) -> None:
    node: Any = data
    for i, key in enumerate(path[:-1]):
        if isinstance(node, dict):
            if key not in node or node[key] is None:
                node[key] = {}
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            where = ".".join(str(p) for p in path[: i + 1])
            raise ConfigError([f"--set {text}: '{where}' is not a mapping"])
    last = path[-1]
    if (isinstance(node, list) and isinstance(last, int) and last < len(node)) or isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError([f"--set {text}: cannot set '{'.'.join(str(p) for p in path)}'"])


def _format_validation(exc: ValidationError, loc: Located, prefix: KeyPath = ()) -> list[str]:
    problems = []
    for err in exc.errors():
        # Drop the discriminator tag pydantic inserts for tagged unions (e.g. 'zero_offload').
        raw_path = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
        path: KeyPath = (*prefix, *raw_path)
        path = tuple(p for p in path if p not in SYSTEM_NAMES)
        dotted = ".".join(str(p) for p in path) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see docs/scenarios.md)"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        problems.append(f"{loc.where(path)}: {dotted}: {msg}")
    return problems



def load_profile(ref: str | Path, relative_to: Path | None = None) -> HardwareProfile:
    """Load a hardware profile by name (a file in hardware_profiles/) or path."""
    located = _load_profile_located(str(ref), relative_to)
    try:
        return HardwareProfile.model_validate(located.data)
    except ValidationError as exc:
        raise ConfigError(_format_validation(exc, located)) from None


def _load_profile_located(ref: str, relative_to: Path | None, where: str = "") -> Located:
    """``where`` prefixes an unknown-name message with the place that named the profile."""
    try:
        path = resolve_profile_path(ref, relative_to)
    except KeyError:
        names = ", ".join(sorted(available_profiles())) or "(none found)"
        raise ConfigError([f"{where}unknown hardware profile '{ref}'; available: {names}"]) from None
    located = read_yaml(path)
    if not isinstance(located.data, dict):
        raise ConfigError([f"{path}:1: a hardware profile must be a mapping"])
    cal = located.data.get("calibration")
    if isinstance(cal, str):
        # Calibration tables are named relative to the profile file so profiles can move with their data.
        resolved = Path(cal) if Path(cal).is_absolute() else (path.parent / cal).resolve()
        located.data["calibration"] = str(resolved)
        _check_calibration(resolved, located.where(("calibration",)))
    return located


def _check_calibration(table: Path, where: str) -> None:
    """A profile naming a missing or malformed table is a load error that names both files."""
    from sosim.table_costs import load_table  # pandas-backed reader; only profiles with a table need it

    try:
        load_table(str(table))
    except ConfigError as exc:
        raise ConfigError([f"{where}: calibration: {p}" for p in exc.problems]) from None


def load_scenario(
    source: str | Path | Mapping[str, Any], overrides: Iterable[str] | None = None
) -> Scenario:
    """Load and validate a scenario from a YAML path or a dict, applying ``key.path=value`` overrides.

    Overrides may reach into the hardware profile (``hardware.link.h2d_GBps=64``) after it is resolved.
    """
    if isinstance(source, Mapping):
        located = Located(data=copy.deepcopy(dict(source)), origin="<dict>")
        base_dir: Path | None = None
    else:
        located = read_yaml(source)
        base_dir = Path(source).resolve().parent
    if not isinstance(located.data, dict):
        raise ConfigError([f"{located.origin}:1: a scenario must be a mapping of keys to values"])
    data = located.data
    parsed = [(parse_override(o), o) for o in (overrides or [])]

    # Overrides of 'hardware' itself pick another profile before it is resolved.
    for (path, value), text in parsed:
        if path == ("hardware",):
            data["hardware"] = value
            located.overridden[path] = text
    hw = data.get("hardware")
    if hw is None:
        raise ConfigError([f"{located.where(())}: hardware: missing (a profile name or path)"])
    if isinstance(hw, (str, Path)):
        prof = _load_profile_located(str(hw), base_dir, where=f"{located.where(('hardware',))}: hardware: ")
        data["hardware"] = prof.data
        # Errors inside the profile point at the profile file and its lines.
        for key, where in prof.lines.items():
            located.lines[("hardware", *key)] = where

    for (path, value), text in parsed:
        if path == ("hardware",):
            continue
        _set_path(data, path, value, text)
        located.overridden[path] = text
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation(exc, located)) from None
