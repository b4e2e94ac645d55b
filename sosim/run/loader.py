"""YAML files and ``--set`` overrides -> validated :class:`~sosim.inputs.config.Scenario`.

Every problem is reported as ``file:line: key.path: message``, all problems of a file at once, so that a
user fixes a scenario in one pass. Line numbers come from PyYAML's node marks, kept in a side table keyed
by the key path; pydantic's error locations are mapped back through it.

Input that could hurt is refused before it is used: files are read up to a size limit and must be UTF-8;
a first pass over the YAML events rejects duplicate keys, recursive aliases, alias expansion past a node
budget (the "billion laughs") and nesting past a depth limit; after validation every number must be finite
and the plan the scenario asks for must be small enough to simulate in about ten seconds.

It sits in sosim.run, above the systems and the costs, because loading resolves a scenario completely (issue 17):
it asks the system registry for the knobs and reads the profile's calibration tables.

Why this module is over 500 lines: every stage of loading (the hardened YAML pass, profiles, --set overrides,
validation, the calibration baseline) reports through the same located-error machinery (Located, the key path ->
line side table), which would otherwise cross module boundaries on every call; the profile search (profile_dirs to
profile_notes) is the part that could move out next.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import re
import stat
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from sosim.inputs.bounds import BOUND_REASONS, MAX_GBPS, MAX_GPUS, MIN_GBPS, FieldProblem
from sosim.inputs.config import KNOBS_CONTEXT, HardwareProfile, Scenario
from sosim.inputs.errors import ConfigError, Problem, ProblemKind
from sosim.inputs.resources import find_example, shipped_profiles_dir
from sosim.inputs.safe_read import MAX_TABLE_BYTES, path_problem, shown_path
from sosim.inputs.safe_read import exists as _exists
from sosim.inputs.safe_read import is_dir as _is_dir
from sosim.inputs.safe_read import is_file as _is_file
from sosim.inputs.safe_read import read_text as _read_text
from sosim.inputs.yaml_tags import scalar_problem, tag_problem
from sosim.schedules.registry import SYSTEM_NAMES, validate_knobs

# What scenario validation needs from above config.py: the systems' knobs models (sosim/schedules/registry.py).
VALIDATION_CONTEXT = MappingProxyType({KNOBS_CONTEXT: validate_knobs})

KeyPath = tuple[str | int, ...]
# libyaml's loader when PyYAML was built with it (several times faster), else the pure-Python one.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# A scenario or profile is a few KB and a sweep file with explicit points perhaps a few MB: anything larger
# is not one of them (and /dev/zero must not be read to exhaustion).
MAX_YAML_BYTES = 16 * 1024 * 1024
# Scenarios nest about six levels deep (hardware.gpu.gemm_efficiency[i][j]); libyaml's composer recurses in
# C and crashes the interpreter on deep nesting, so depth is checked on the event stream first.
MAX_YAML_DEPTH = 64
# Values after alias expansion: a 300-byte alias bomb expands to billions; real files have thousands.
MAX_YAML_NODES = 1_000_000
# Layers x micro-batches x iterations the event simulation walks. A pass is 10-30 ops and the engine runs
# ~100,000 ops/s on one core (scripts/bench_sim.py), so this bound is roughly ten seconds of simulation.
MAX_LAYER_PASSES = 100_000
# A number written with more characters than this is refused as it is read: the longest exact double
# (0.1000000000000000055511151231257827021181583404541015625) has 57; past 4,300 digits Python cannot even
# build the integer. The model's own bounds (sosim/inputs/config.py, MAX_INT) then refuse integers past 2^53.
MAX_NUMBER_CHARS = 100
MAX_SHOWN_OVERRIDE = 120  # characters of a --set shown in a message
_NUMBER_LIKE = re.compile(r"[-+]?\.?[0-9][0-9a-fA-FxXoObB_:.eE+-]*")

# User profile folders (os.pathsep-separated) searched before the shipped ones. SOSIM_PROFILE_PATH is the
# older name, still read.
PROFILES_ENV = "SOSIM_PROFILES"
_LEGACY_PROFILES_ENV = "SOSIM_PROFILE_PATH"


@dataclass
class Located:
    """A parsed YAML document plus where each key path came from."""

    data: Any
    origin: str  # file name shown in messages
    # key path -> (file, line); a scenario's hardware keys point into the profile file.
    lines: dict[KeyPath, tuple[str, int]] = field(default_factory=dict)
    # Key paths set by --set: reported as the override, not as a line of the file.
    overridden: dict[KeyPath, str] = field(default_factory=dict)

    def override_at(self, path: KeyPath) -> str | None:
        """The ``--set`` text that set ``path`` or a section above it (None: the file's)."""
        for i in range(len(path), -1, -1):
            if path[:i] in self.overridden:
                return self.overridden[path[:i]]
        return None

    def problem(self, path: KeyPath, message: str, kind: ProblemKind = "value") -> Problem:
        """A problem at ``path``, located as :meth:`where`."""
        text = self.override_at(path)
        return Problem(self.where(path), dotted(path), message, kind, () if text is None else (text,))

    def where(self, path: KeyPath) -> str:
        """Best location for a key path: the override that set it (or a section above it), else the nearest
        line in the file."""
        text = self.override_at(path)
        if text is not None:
            return f"--set {text}"
        # Keys are indexed as YAML wrote them (text); a key YAML read as a number (grid: {1: ...}) is found
        # by its text too.
        as_text: dict[tuple[str, ...], tuple[str, int]] | None = None
        for i in range(len(path), -1, -1):
            prefix = path[:i]
            found = self.lines.get(prefix)
            if found is None:
                if as_text is None:
                    as_text = {tuple(map(str, k)): v for k, v in self.lines.items()}
                found = as_text.get(tuple(map(str, prefix)))
            if found is not None:
                return f"{found[0]}:{found[1]}"
        return f"{self.origin}:1"


    def blame(self, path: KeyPath, message: str) -> tuple[str, str, tuple[str, ...]]:
        """Where a problem found at ``path`` comes from, and a note to add to its message. As :meth:`where`,
        except that a problem a section (or the whole scenario) reports about a combination of values is put
        on the ``--set`` below it that the message names ('heads (7) must divide hidden' after
        --set model.heads=7); when the message names none of them, the file location stays and the note says
        which overrides took part. Third: the ``--set`` texts it is put on."""
        text = self.override_at(path)
        if text is not None:
            return f"--set {text}", "", (text,)
        shown = self.where(path)
        below = [(p, t) for p, t in self.overridden.items() if len(p) > len(path) and p[: len(path)] == path]
        if not below:
            return shown, "", ()
        named = [t for p, t in below if _mentions(message, p)]
        # Else the ones in a section the message names ('cluster.gpus: ...' after --set cluster.gpus_per_node=3).
        named = named or [t for p, t in below if len(p) > 1 and f"{dotted(p[:-1])}." in message]
        if named:
            return ", ".join(f"--set {t}" for t in named), "", tuple(named)
        return shown, f" (with {', '.join(f'--set {t}' for _, t in below)})", ()


def _mentions(message: str, path: KeyPath) -> bool:
    """Whether ``message`` names the key at ``path`` (its dotted path or its last key, as a whole word)."""
    if dotted(path) in message:
        return True
    last = str(path[-1])
    return bool(last) and re.search(rf"(?<![\w.]){re.escape(last)}(?!\w)", message) is not None


def _key_text(key: str | int) -> str:
    text = str(key)
    # A key that would not read back as one (empty, spaces, a colon or dot inside) is shown quoted.
    if not text or text != text.strip() or any(c in text for c in ": \t\n\r") or not text.isprintable():
        return repr(text)
    return text


def dotted(path: KeyPath) -> str:
    """``('a', 'b', 0)`` -> ``a.b.0``; the key path as messages show it."""
    return ".".join(_key_text(p) for p in path) or "(top level)"


class _YamlSyntaxError(ConfigError):
    """Text that is not YAML (an override value that is not YAML is taken as a plain string instead)."""


# ----------------------------------------------------------------------------------------- safe YAML


@dataclass(slots=True)
class _Frame:
    """An open mapping or sequence while scanning the event stream."""

    path: KeyPath
    anchor: str | None
    is_map: bool
    size: int = 1  # values inside, aliases expanded
    children: int = 0  # mappings: keys and values alternate, so an even count means a key comes next
    key: str | None = None  # mappings: the key whose value comes next (None: a complex key)
    keys: dict[str, str] = field(default_factory=dict)  # key -> where it first occurs ("line 3")


def _at(origin: str, line: int) -> str:
    return origin if origin.startswith("--set ") else f"{origin}:{line}"


def _check_events(text: str, origin: str, prefix: KeyPath = ()) -> None:
    """One pass over the YAML events before anything is built from them.

    Rejects duplicate keys (PyYAML silently keeps the last), recursive aliases, alias expansion past
    MAX_YAML_NODES and nesting past MAX_YAML_DEPTH. Duplicate keys are all reported; the others stop the scan.
    """
    problems: list[str] = []
    stack: list[_Frame] = []
    sizes: dict[str, int] = {}  # anchor -> values inside it, aliases expanded
    open_anchors: set[str] = set()
    expanded = 0
    cap = MAX_YAML_NODES + 1

    def done(n: int) -> None:
        if stack:
            top = stack[-1]
            top.size = min(top.size + n, cap)
            top.children += 1

    try:
        for ev in yaml.parse(text, Loader=_Loader):
            if isinstance(ev, (yaml.StreamStartEvent, yaml.StreamEndEvent, yaml.DocumentStartEvent,
                               yaml.DocumentEndEvent)):
                continue
            line = ev.start_mark.line + 1 if ev.start_mark is not None else 1
            if isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                closed = stack.pop()
                if closed.anchor is not None:
                    sizes[closed.anchor] = closed.size
                    open_anchors.discard(closed.anchor)
                done(closed.size)
                continue
            parent = stack[-1] if stack else None
            is_key = parent is not None and parent.is_map and parent.children % 2 == 0
            if parent is None:
                path = prefix
            elif parent.is_map:
                path = parent.path if is_key else (*parent.path, parent.key if parent.key is not None else "?")
            else:
                path = (*parent.path, parent.children)
            anchor = getattr(ev, "anchor", None)
            if isinstance(ev, yaml.AliasEvent):
                if anchor in open_anchors:
                    raise ConfigError([f"{_at(origin, line)}: {dotted(path)}: recursive alias *{anchor} "
                                       "(a value that contains itself)"])
                n = sizes.get(str(anchor), 1)  # an undefined alias is the composer's error, reported later
                expanded += n
                if is_key and parent is not None:
                    parent.key = None
                done(n)
            elif isinstance(ev, yaml.ScalarEvent):
                expanded += 1
                bad_tag = scalar_problem(ev)  # a tag outside the safe core, or a value its tag cannot hold
                if bad_tag is not None:
                    raise ConfigError([f"{_at(origin, line)}: {dotted(path)}: {bad_tag}"])
                if not ev.style and len(ev.value) > MAX_NUMBER_CHARS and _NUMBER_LIKE.fullmatch(ev.value):
                    # Python refuses to build integers past 4,300 digits (an error inside PyYAML otherwise).
                    raise ConfigError([f"{_at(origin, line)}: {dotted(path)}: a number of {len(ev.value):,} "
                                       f"characters; no value sosim takes needs more than {MAX_NUMBER_CHARS} "
                                       "(docs/limits.md)"])
                if anchor is not None:
                    sizes[anchor] = 1
                if is_key and parent is not None:
                    key = str(ev.value)
                    first = parent.keys.get(key)
                    col = ev.start_mark.column + 1 if ev.start_mark is not None else 1
                    if first is not None and key != "<<":  # '<<' merge keys may repeat
                        if first.startswith(f"line {line},"):  # both in one flow mapping: say which column
                            first = first.replace(f"line {line}, ", "")
                        else:
                            first = first.split(",")[0]
                        problems.append(f"{_at(origin, line)}: {dotted((*parent.path, key))}: duplicate key "
                                        f"(first at {first}); each key may appear once")
                    else:
                        parent.keys[key] = f"line {line}, column {col}"
                    parent.key = key
                done(1)
            else:  # a mapping or sequence starts
                expanded += 1
                bad_tag = tag_problem(getattr(ev, "tag", None))
                if bad_tag is not None:
                    raise ConfigError([f"{_at(origin, line)}: {dotted(path)}: {bad_tag}"])
                if is_key and parent is not None:
                    parent.key = None
                if len(stack) >= MAX_YAML_DEPTH:
                    raise ConfigError([f"{_at(origin, line)}: {dotted(path)}: nested more than {MAX_YAML_DEPTH} "
                                       "levels deep"])
                if anchor is not None:
                    open_anchors.add(anchor)
                stack.append(_Frame(path, anchor, isinstance(ev, yaml.MappingStartEvent)))
            if expanded > MAX_YAML_NODES:
                raise ConfigError([f"{_at(origin, line)}: {dotted(path)}: the document expands to more than "
                                   f"{MAX_YAML_NODES:,} values (aliases included); refusing to build it"])
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else 1
        raise _YamlSyntaxError([f"{_at(origin, line)}: YAML syntax error: {exc.problem}"]) from None
    except yaml.reader.ReaderError as exc:  # a control character: located by its position in the text
        line = text.count("\n", 0, exc.position) + 1
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        raise _YamlSyntaxError([f"{_at(origin, line)}: YAML syntax error: character U+{ord(char):04X} is not "
                                "allowed in YAML (a control character)"]) from None
    except yaml.YAMLError as exc:
        raise _YamlSyntaxError([f"{_at(origin, 1)}: YAML error: {exc}"]) from None
    if problems:
        raise ConfigError(problems)


def _compose(text: str, origin: str, prefix: KeyPath = ()) -> tuple[yaml.Node | None, Any]:
    """Checked text -> (node tree with line marks, Python data), in one parse after the event check."""
    _check_events(text, origin, prefix)
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else 1
        raise _YamlSyntaxError([f"{_at(origin, line)}: YAML syntax error: {exc.problem}"]) from None
    except yaml.YAMLError as exc:
        raise _YamlSyntaxError([f"{_at(origin, 1)}: YAML error: {exc}"]) from None
    return node, data


def _index_lines(node: yaml.Node, path: KeyPath, origin: str, lines: dict[KeyPath, tuple[str, int]]) -> None:
    # Depth and alias expansion are bounded by _check_events, so this recursion is bounded too.
    lines.setdefault(path, (origin, node.start_mark.line + 1))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key = key_node.value
            key_path = (*path, key)
            lines[key_path] = (origin, key_node.start_mark.line + 1)
            _index_lines(value_node, key_path, origin, lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, (*path, i), origin, lines)


def parse_yaml(text: str, origin: str) -> Located:
    """Parse YAML text keeping line numbers; every problem becomes a ConfigError with its line."""
    node, data = _compose(text, origin)
    lines: dict[KeyPath, tuple[str, int]] = {}
    if node is not None:
        _index_lines(node, (), origin, lines)
    return Located(data=data if data is not None else {}, origin=origin, lines=lines)


def read_text(path: str | Path, what: str = "file") -> str:
    """A regular text file of at most MAX_YAML_BYTES, decoded as UTF-8; problems become a ConfigError
    (the one reader every input goes through: sosim/inputs/safe_read.py)."""
    return _read_text(path, what, MAX_YAML_BYTES)


def read_yaml(path: str | Path) -> Located:
    return parse_yaml(read_text(path), shown_path(path))


# ------------------------------------------------------------------------------------------- profiles


@dataclass(frozen=True)
class ProfileFile:
    name: str
    path: Path
    origin: str  # "--profiles", "SOSIM_PROFILES", "user" (the default user folder) or "shipped"


def default_user_profiles_dir() -> Path:
    """Where ``sosim calibrate --profile NAME`` writes by default (no --profiles, no $SOSIM_PROFILES):
    ``$XDG_CONFIG_HOME/sosim/profiles``, else ``~/.config/sosim/profiles`` (sosim/calibrate/cli.py, same rule)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sosim" / "profiles"


def profile_dirs(user_dirs: Sequence[str | Path] = ()) -> list[tuple[Path, str]]:
    """Folders searched for profiles by name, in order: ``--profiles``, $SOSIM_PROFILES, the default user folder
    (:func:`default_user_profiles_dir`), the shipped ones."""
    env = [d for var in (PROFILES_ENV, _LEGACY_PROFILES_ENV) for d in os.environ.get(var, "").split(os.pathsep) if d]
    return [*((Path(d), "--profiles") for d in user_dirs), *((Path(d), PROFILES_ENV) for d in env),
            (default_user_profiles_dir(), "user"), (shipped_profiles_dir(), "shipped")]


def profile_files(user_dirs: Sequence[str | Path] = ()) -> dict[str, list[ProfileFile]]:
    """Profile name -> every file of that name, in search order (the first one is used)."""
    found: dict[str, list[ProfileFile]] = {}
    seen: set[Path] = set()
    for folder, origin in profile_dirs(user_dirs):
        if not _is_dir(folder):  # also a name the file system refuses ($SOSIM_PROFILES of 5,000 characters)
            continue
        for f in sorted(folder.glob("*.yaml")):
            real = f.resolve()
            if real in seen:  # the same folder named twice
                continue
            seen.add(real)
            found.setdefault(f.stem, []).append(ProfileFile(f.stem, f, origin))
    return found


def available_profiles(user_dirs: Sequence[str | Path] = ()) -> dict[str, Path]:
    """Profile name -> the file used for it (user folders shadow the shipped profiles)."""
    return {name: files[0].path for name, files in profile_files(user_dirs).items()}


def _shadow_note(name: str, files: Sequence[ProfileFile]) -> str:
    used, others = files[0], files[1:]
    also = "; ".join(f"{f.path} ({f.origin})" for f in others)
    return f"hardware profile '{name}': using {used.path} ({used.origin}), which shadows {also}"


def resolve_profile_path(ref: str, relative_to: Path | None, user_dirs: Sequence[str | Path] = (),
                         notes: list[str] | None = None) -> Path:
    """A profile file from a path (relative to ``relative_to`` or the working folder) or a name.

    Raises KeyError for an unknown name. Where a name exists in several folders, the first is used and a
    note saying which (and what it shadows) is appended to ``notes``.
    """
    candidates = []
    if relative_to is not None:
        candidates.append(relative_to / ref)
    candidates.append(Path(ref))
    for c in candidates:
        if c.suffix in (".yaml", ".yml") and _is_file(c):
            return c
    files = profile_files(user_dirs).get(ref)
    if not files:
        raise KeyError(ref)
    if len(files) > 1 and notes is not None:
        notes.append(_shadow_note(ref, files))
    return files[0].path


def profile_notes(source: str | Path, overrides: Iterable[str] = (),
                  user_dirs: Sequence[str | Path] = ()) -> list[str]:
    """The notes load_scenario(source, overrides) gives about the profile it picks (a name found in several
    folders), for callers that load through another path. Never raises: problems are the loader's to report."""
    notes: list[str] = []
    try:
        ref: Any = None
        for text in overrides:
            key, sep, value = text.partition("=")
            if sep and key.strip() == "hardware":
                ref = value.strip()
        path = resolve_scenario_path(source)
        if ref is None:
            data = read_yaml(path).data
            ref = data.get("hardware") if isinstance(data, dict) else None
        if isinstance(ref, str):
            resolve_profile_path(ref, path.resolve().parent, user_dirs, notes)
    except (ConfigError, KeyError, OSError):
        return []
    return notes


# ------------------------------------------------------------------------------------------ overrides


def shown_override(text: str) -> str:
    """An override as messages show it: control characters escaped, so a message stays one line; a long one
    cut (a 5,000-digit value would fill the screen)."""
    shown = text if text.isprintable() else text.encode("unicode_escape").decode("ascii")
    if len(shown) <= MAX_SHOWN_OVERRIDE:
        return shown
    return f"{shown[:MAX_SHOWN_OVERRIDE - 30]}... ({len(text):,} characters)"


def parse_override(text: str) -> tuple[KeyPath, Any]:
    """``a.b.c=value`` -> (("a","b","c"), parsed value). The value is parsed as YAML (numbers, lists...)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # bytes from the command line that are not UTF-8 (kept as surrogates)
        shown = text.encode("utf-8", "backslashreplace").decode()
        raise ConfigError([Problem(f"--set {shown}", "", "not UTF-8 text", "override_syntax", (text,))]) from None
    shown = shown_override(text)
    if "=" not in text:
        raise ConfigError([Problem(f"--set {shown}", "", "expected key.path=value", "override_syntax", (text,))])
    key, _, raw = text.partition("=")
    parts = key.strip().split(".")
    if not key.strip() or any(not p.strip() for p in parts):
        raise ConfigError([Problem(f"--set {shown}", "", f"empty key in '{shown_override(key)}'", "empty_key",
                                   (text,))])
    if len(parts) > MAX_YAML_DEPTH:  # a 5,000-part key recursed past Python's limit while it was set
        raise ConfigError([f"--set {shown}: a key of {len(parts):,} parts; no key sosim takes is nested more "
                           f"than {MAX_YAML_DEPTH} levels"])
    path: KeyPath = tuple(int(p) if p.isascii() and p.isdigit() else p.strip() for p in parts)
    try:
        value = _compose(raw, f"--set {shown}", path)[1] if raw.strip() else ""
    except _YamlSyntaxError:
        value = raw  # not YAML: the text itself (a name with a colon, say)
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
            raise ConfigError([Problem(f"--set {text}", "", f"'{dotted(path[: i + 1])}' is not a mapping",
                                       "not_a_mapping", (text,))])
    last = path[-1]
    if isinstance(node, dict):
        node[last] = value
        return
    if isinstance(node, list) and isinstance(last, int) and last < len(node):
        node[last] = value
        return
    raise ConfigError([Problem(f"--set {text}", "", f"cannot set '{dotted(path)}'", "cannot_set", (text,))])


# ---------------------------------------------------------------------------------------- validation


def _format_validation(exc: ValidationError, loc: Located, prefix: KeyPath = (),
                       skip: Iterable[KeyPath] = ()) -> list[Problem]:
    """pydantic's errors as ``file:line: key: message``; errors at the paths in ``skip`` (already reported)
    are left out."""
    skipped = set(skip)
    problems: list[Problem] = []
    for err in exc.errors():
        # Drop the discriminator tag pydantic inserts for tagged unions (e.g. 'zero_offload').
        raw_path = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
        path: KeyPath = (*prefix, *raw_path)
        path = tuple(p for p in path if p not in SYSTEM_NAMES)
        if path in skipped:
            continue
        msg = err["msg"]
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldProblem):  # a model-level check about one of its fields: point at that key
            path = (*path, *cause.path)
            msg = f"Value error, {cause.message}"
        kind: ProblemKind = "value"
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see docs/scenarios.md)"
            kind = "unknown_key"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        bounded = next((str(p) for p in reversed(path) if str(p) in _BOUNDED), None)  # a curve's point: its field
        if err["type"] in ("less_than_equal", "greater_than_equal", "less_than", "greater_than") and bounded:
            msg += f" ({_BOUNDED[bounded]}; docs/limits.md)"
        where, note, overrides = loc.blame(path, msg)
        problems.append(Problem(where, dotted(path), f"{msg}{note}", kind, overrides))
    return problems


# Fields whose bounds are sanity bounds (sosim/inputs/config.py says why), named in their messages.
_BOUNDED = {**dict.fromkeys(("gpus", "data_parallel", "sequence_parallel", "gpus_per_node"),
                            f"at most {MAX_GPUS:,} GPUs: ten times the largest training clusters"),
            **dict.fromkeys(("h2d_GBps", "d2h_GBps", "bidir_GBps", "hbm_GBps", "mem_GBps", "cast_GBps",
                             "gpu_gpu_GBps", "node_node_GBps", "GBps", "read_GBps", "write_GBps", "dram_GBps"),
                            f"a bandwidth between {MIN_GBPS:g} and {MAX_GBPS:g} GB/s: slower than any real link, or "
                            "faster than any memory"),
            **BOUND_REASONS}


def _non_finite(value: Any, path: KeyPath) -> Iterator[tuple[KeyPath, float]]:
    if isinstance(value, float):
        if not math.isfinite(value):
            yield path, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _non_finite(getattr(value, name), (*path, name))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _non_finite(item, (*path, i))
    elif isinstance(value, Mapping):
        for k, item in value.items():
            yield from _non_finite(item, (*path, k))


def _all_finite(value: Any) -> bool:
    """True when :func:`_non_finite` would find nothing in ``value`` (a quick gate: a model's ``__dict__``
    may also hold cached values, which can only make it answer False, and then the full scan decides)."""
    stack = [value]
    isfinite = math.isfinite
    while stack:
        v = stack.pop()
        t = type(v)
        # Exact types first (the common case, cheaper than the isinstance chain below, same answers).
        if t is float:
            if not isfinite(v):
                return False
            continue
        if t is str or t is int or t is bool or v is None:
            continue
        if isinstance(v, float):
            if not math.isfinite(v):
                return False
        elif isinstance(v, (str, int, bool)) or v is None:
            continue
        elif isinstance(v, BaseModel):
            stack.extend(v.__dict__.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, Mapping):
            stack.extend(v.values())
    return True


def finite_problems(value: BaseModel, loc: Located, prefix: KeyPath = ()) -> list[Problem]:
    """Every inf/NaN in a validated model (pydantic accepts them in float fields), with its location."""
    return [_not_finite(loc, p, v) for p, v in _non_finite(value, prefix)]


def _not_finite(loc: Located, path: KeyPath, value: float) -> Problem:
    return loc.problem(path, f"not a finite number ({value}); give a finite value")


def _work_problems(sc: Scenario, loc: Located) -> list[Problem]:
    """Refuse a plan too large to simulate in reasonable time, naming the key that made it large."""
    layers, accum, its = sc.model.layers, sc.training.grad_accum, sc.training.iterations
    passes = layers * accum * its
    if passes <= MAX_LAYER_PASSES:
        return []
    path: KeyPath = ("model", "layers") if layers >= accum else ("training", "grad_accum")
    return [loc.problem(path, f"{layers:,} layers x {accum:,} micro-batches (grad_accum) x {its} iterations = "
                              f"{passes:,} layer passes to simulate, more than the {MAX_LAYER_PASSES:,} this tool runs "
                              "(about ten seconds); use fewer layers, micro-batches or iterations")]


# ------------------------------------------------------------------------------------------- loading


def load_profile(ref: str | Path, relative_to: Path | None = None, *, profile_dirs: Sequence[str | Path] = (),
                 notes: list[str] | None = None) -> HardwareProfile:
    """Load a hardware profile by name (``--profiles`` folders, $SOSIM_PROFILES, then the shipped ones) or path."""
    located = _load_profile_located(str(ref), relative_to, user_dirs=profile_dirs, notes=notes)
    raw_bad = dict(_non_finite(located.data, ()))
    nan_problems = [_not_finite(located, p, v) for p, v in raw_bad.items()]
    try:
        profile = HardwareProfile.model_validate(located.data)
    except ValidationError as exc:
        raise ConfigError(nan_problems + _format_validation(exc, located, skip=raw_bad)) from None
    problems = nan_problems or finite_problems(profile, located)
    if problems:
        raise ConfigError(problems)
    return profile


def _resolve_calibration(cal: str, profile_path: Path) -> Path:
    """A table named relative to its profile file; a copy of a shipped profile elsewhere keeps its table."""
    if Path(cal).is_absolute() or path_problem(cal) is not None:  # a bad name: _check_calibration says why
        return Path(cal)
    beside = (profile_path.parent / cal).resolve()
    if _exists(beside):
        return beside
    shipped = (shipped_profiles_dir() / cal).resolve()
    return shipped if _exists(shipped) else beside


def _load_profile_located(ref: str, relative_to: Path | None, where: str = "",
                          user_dirs: Sequence[str | Path] = (), notes: list[str] | None = None) -> Located:
    """``where`` prefixes an unknown-name message with the place that named the profile."""
    try:
        path = resolve_profile_path(ref, relative_to, user_dirs, notes)
    except KeyError:
        names = ", ".join(sorted(available_profiles(user_dirs))) or "(none found)"
        # The name as typed, control characters escaped: a message is one line.
        raise ConfigError([f"{where}unknown hardware profile '{shown_override(ref)}'; available: {names} (more "
                           f"folders: --profiles DIR or ${PROFILES_ENV})"]) from None
    located = read_yaml(path)
    if not isinstance(located.data, dict):
        raise ConfigError([f"{path}:1: (top level): a hardware profile must be a mapping of keys to values"])
    cal = located.data.get("calibration")
    if isinstance(cal, str):
        resolved = _resolve_calibration(cal, path)
        located.data["calibration"] = str(resolved)
        _check_calibration(resolved, located.where(("calibration",)))
    elif isinstance(cal, list):
        # Several tables (measured on different days): each resolved and checked on its own line.
        tables = []
        for i, item in enumerate(cal):
            if not isinstance(item, str):
                raise ConfigError([f"{located.where(('calibration', i))}: calibration: each entry must be a "
                                   f"path to a measurements.csv, got {item!r}"])
            resolved = _resolve_calibration(item, path)
            _check_calibration(resolved, located.where(("calibration", i)))
            tables.append(str(resolved))
        if not tables:
            raise ConfigError([f"{located.where(('calibration',))}: calibration: an empty list; leave the key out "
                               "for an uncalibrated profile"])
        located.data["calibration"] = tables
    return located


def _override_tables(value: Any, text: str) -> Any:
    """``--set hardware.calibration=...``: each table named resolved and checked (a list form too)."""
    def one(item: str) -> str:
        if path_problem(item) is None:
            item = str(Path(item).resolve())
        _check_calibration(Path(item), f"--set {text}")
        return item

    if isinstance(value, str):
        return one(value)
    if isinstance(value, list):
        if not value:
            raise ConfigError([f"--set {text}: calibration: an empty list; leave the key out for an uncalibrated "
                               "profile"])
        bad = [item for item in value if not isinstance(item, str)]
        if bad:
            bad = bad[0]
            raise ConfigError([f"--set {text}: calibration: each entry must be a path to a measurements.csv, got "
                               f"{bad!r}"])
        return [one(item) for item in value]
    return value  # another type: validation names it


def _check_calibration(table: Path, where: str) -> None:
    """A profile naming a missing or malformed table is a load error that names both files."""
    from sosim.costs.table import load_table  # pandas-backed reader; only profiles with a table need it

    # A device, a FIFO or a folder (/dev/zero, /tmp) would be read without end, block or fail obscurely: a
    # regular file only, of a plausible size (tables are tens of KB), with a name the file system can hold.
    from sosim.inputs.safe_read import file_kind

    problem = path_problem(table)
    if problem is not None:
        raise ConfigError([f"{where}: calibration: {shown_path(table)}: {problem}"])
    try:
        st = table.stat()
    except OSError:
        st = None  # missing: load_table says so, naming the file
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ConfigError([f"{where}: calibration: {shown_path(table)}: not a regular file ({file_kind(st.st_mode)})"])
    if st is not None and st.st_size > MAX_TABLE_BYTES:
        raise ConfigError([f"{where}: calibration: {table}: larger than {MAX_TABLE_BYTES // 2**20} MiB: not a "
                           "calibration table"])

    try:
        load_table(str(table))
    except ConfigError as exc:
        raise ConfigError([f"{where}: calibration: {p}" for p in exc.problems]) from None


# ---- the calibration baseline: the profile file that names a table ------------------------------------------
@functools.lru_cache(maxsize=32)
def _profile_file(path: str, mtime_ns: int, size: int) -> HardwareProfile | None:
    """A profile file as loaded (no overrides); None if it does not load. Memo keyed by the file version."""
    del mtime_ns, size
    try:
        return load_profile(path)
    except ConfigError:
        return None


def _candidate_files(name: str) -> Iterator[Path]:
    found = available_profiles()
    if name in found:
        yield found[name]
    yield from (p for n, p in found.items() if n != name)


def find_baseline(hw: HardwareProfile) -> tuple[HardwareProfile | None, str]:
    """The profile file that names ``hw``'s calibration table, as loaded from disk, and its path.

    The profile of the same name first (the scenario's profile before any ``--set``), then any available
    profile naming the same table (e.g. another machine's profile pointed at this table). (None, "") when
    no profile file names it (an inline profile): its own numbers are then the baseline. Looked up once when
    a scenario is loaded (:func:`with_baseline`); the cost model reads the answer, it never searches.
    """
    if hw.calibration is None:
        return None, ""
    target = [Path(p).resolve() for p in hw.calibration_paths]
    # A profile naming exactly these tables first; else one whose tables include all of them (a profile
    # pointed at one of the tables of a calibrated machine is rescaled from that machine's numbers).
    containing: tuple[HardwareProfile, str] | None = None
    for path in _candidate_files(hw.name):
        try:
            st = path.stat()
        except OSError:
            continue
        prof = _profile_file(str(path), st.st_mtime_ns, st.st_size)
        if prof is None:
            continue
        theirs = [Path(p).resolve() for p in prof.calibration_paths]
        if theirs == target:
            return prof, str(path)
        if containing is None and theirs and all(t in theirs for t in target):
            containing = (prof, str(path))
    return containing if containing is not None else (None, "")


def with_baseline(sc: Scenario) -> Scenario:
    """``sc`` with its calibrated hardware's baseline looked up (once per hardware instance)."""
    hw = sc.hardware
    if hw.calibration is not None and hw._calibration_baseline is None:
        hw._calibration_baseline = find_baseline(hw)
    return sc


def scenario_from_data(data: Mapping[str, Any]) -> Scenario:
    """A scenario validated from plain data (every section a mapping or a validated instance), the system's
    knobs included: for callers that build scenario data in code. :func:`load_scenario` adds located error
    messages, overrides and profile resolution."""
    return with_baseline(Scenario.model_validate(data, context=VALIDATION_CONTEXT))


def resolve_scenario_path(source: str | Path) -> Path:
    """A scenario file, or a shipped example by name (``sosim examples`` lists them)."""
    problem = path_problem(source)
    if problem is not None:  # "" is not the working folder, a 300-character name is not a missing file
        raise ConfigError([f"{shown_path(source)}: cannot read scenario: {problem}"])
    p = Path(source)
    if _exists(p):
        return p
    example = find_example(str(source))
    return example if example is not None else p


def input_files(sources: Iterable[str | Path | None]) -> list[str]:
    """The files a command reads for these scenario arguments (a shipped example's name: its file), for an
    output that must not replace one of them (sosim/formats/safe_write.py)."""
    found: list[str] = []
    for source in sources:
        if not source:
            continue
        found.append(str(source))
        try:
            found.append(str(resolve_scenario_path(source)))
        except ConfigError:
            continue
    return found


def load_scenario(
    source: str | Path | Mapping[str, Any],
    overrides: Iterable[str] | None = None,
    *,
    profile_dirs: Sequence[str | Path] = (),
    notes: list[str] | None = None,
) -> Scenario:
    """Load and validate a scenario from a YAML path (or a shipped example's name) or a dict, applying
    ``key.path=value`` overrides.

    Overrides may reach into the hardware profile (``hardware.link.h2d_GBps=64``) after it is resolved.
    ``profile_dirs`` are searched for profiles by name before $SOSIM_PROFILES and the shipped profiles;
    notes about the resolution (a profile name found in several folders) are appended to ``notes``.
    """
    if isinstance(source, Mapping):
        located = Located(data=copy.deepcopy(dict(source)), origin="<dict>")
        base_dir: Path | None = None
    else:
        path = resolve_scenario_path(source)
        try:
            located = read_yaml(path)
        except ConfigError as exc:
            if not _exists(source):  # nor a shipped example: say where to find those
                raise ConfigError([f"{exc.problems[0]} (nor a shipped example: sosim examples lists them)",
                                   *exc.problems[1:]]) from None
            raise
        base_dir = path.resolve().parent
    if not isinstance(located.data, dict):
        raise ConfigError([f"{located.origin}:1: (top level): a scenario must be a mapping of keys to values"])
    data = located.data
    parsed = [(parse_override(o), shown_override(o)) for o in (overrides or [])]

    # Overrides of 'hardware' itself pick another profile before it is resolved.
    for (key_path, value), text in parsed:
        if key_path == ("hardware",):
            data["hardware"] = value
            located.overridden[key_path] = text
    hw = data.get("hardware")
    if hw is None:
        raise ConfigError([f"{located.where(())}: hardware: missing (a profile name or path)"])
    if isinstance(hw, (str, Path)):
        prof = _load_profile_located(str(hw), base_dir, where=f"{located.where(('hardware',))}: hardware: ",
                                     user_dirs=profile_dirs, notes=notes)
        data["hardware"] = prof.data
        # A profile picked by --set hardware=NAME: problems inside it point at its file, not the override.
        located.overridden.pop(("hardware",), None)
        # Errors inside the profile point at the profile file and its lines.
        for key, where in prof.lines.items():
            hw_key: KeyPath = ("hardware", *key)
            located.lines[hw_key] = where

    for (key_path, value), text in parsed:
        if key_path == ("hardware",):
            continue
        if key_path[:2] == ("hardware", "calibration"):
            # Tables named on the command line (one, a list, or one entry of a list) are relative to the
            # working folder, and checked as a profile's are, at the --set that names them.
            value = _override_tables(value, text)
        _set_path(data, key_path, value, text)
        located.overridden[key_path] = text
    # inf/NaN written as numbers (.inf, .nan, 1e999 in flow YAML) are named as such, not as a failed bound.
    raw_bad = dict(_non_finite(data, ()))
    sc, nan_problems = _validate_scenario(data, located, raw_bad)
    problems = nan_problems or finite_problems(sc, located) or _work_problems(sc, located)
    if problems:
        raise ConfigError(problems)
    return sc


def _validate_scenario(data: Mapping[str, Any], located: Located,
                       raw_bad: Mapping[tuple[Any, ...], Any]) -> tuple[Scenario, list[Problem]]:
    """The validated scenario and the non-finite numbers named as such (inf/NaN written as numbers are
    reported as not finite, not as a failed bound); a validation error is a ConfigError with both."""
    nan_problems = [_not_finite(located, p, v) for p, v in raw_bad.items()]
    try:
        return with_baseline(Scenario.model_validate(data, context=VALIDATION_CONTEXT)), nan_problems
    except ValidationError as exc:
        raise ConfigError(nan_problems + _format_validation(exc, located, skip=raw_bad)) from None


def load_derived(base: Scenario, sections: Mapping[str, Any], checked: Collection[str] = ()) -> Scenario:
    """``base`` with the top-level ``sections`` (e.g. ``training``, ``cluster``, ``schedule``) replaced by new
    data, validated exactly as :func:`load_scenario` validates ``{**base's data, **sections}`` (same checks,
    same messages, origin ``<dict>``), but the sections left as they are (the hardware profile above all, the
    largest) are reused as validated rather than copied, re-validated and re-scanned: a search derives
    thousands of candidates from one base (sosim/answers/tune/api.py).

    Only valid for a ``base`` that :func:`load_scenario` produced (its sections are finite and validated).
    ``checked`` names sections given as instances that an earlier load validated (so finite): they are not
    scanned again (validation keeps an instance as it is).
    """
    # Nothing here writes to the data (load_scenario copies because overrides and the profile are written in).
    located = Located(data=dict(sections), origin="<dict>")
    data = located.data
    # The reused sections are validated instances: pydantic keeps them as they are (no re-validation).
    full: dict[str, Any] = {name: getattr(base, name) for name in type(base).model_fields if name not in data}
    full.update(data)
    scan = data if not checked else {k: v for k, v in data.items() if k not in checked}
    raw_bad = {} if _all_finite(scan) else dict(_non_finite(scan, ()))
    sc, nan_problems = _validate_scenario(full, located, raw_bad)
    # A section passed as an instance and kept as it is was scanned with the data above (found finite).
    problems = nan_problems or [
        problem for name in type(sc).model_fields
        if name in data and getattr(sc, name) is not data[name] and not _all_finite(getattr(sc, name))
        for problem in finite_problems(getattr(sc, name), located, (name,))] or _work_problems(sc, located)
    if problems:
        raise ConfigError(problems)
    return sc
