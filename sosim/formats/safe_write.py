"""The one way sosim writes an output file: never over a file the user did not ask it to replace.

Why: ``check --write PATH`` replaced whatever was at PATH (a user's notes, a symlink, a FIFO, a device node),
``--emit-ds-config`` could overwrite the very ``--ds-config`` it was reading, and ``--trace``, ``--plot``,
``--junit`` overwrote silently. Every output (``run --trace/--plot/--emit-ds-config``, ``compare --plot``,
``check --write/--junit``, ``tune --out``, ``sweep --out``) now goes through :func:`prepare_output` before
any work and :func:`write_atomic` at the end:

- the target may be absent; or a regular file that is recognisably the command's own previous output
  (each output names its :data:`Recogniser`: a baseline's ``"format"``, a trace's ``traceEvents``, a
  figure's Matplotlib signature...); anything else needs ``--force``;
- never a symlink, a FIFO, a device, a socket or a folder, even with ``--force`` (opening a FIFO for
  writing blocks; writing through a symlink writes somewhere else);
- never a file this command reads (``--emit-ds-config`` over its ``--ds-config``), even with ``--force``;
- the content goes to a temporary file beside the target, which is renamed over it only when complete
  (a reader never sees half a file, an interrupted write leaves the old file) and removed on any failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from sosim.inputs.errors import SosimError
from sosim.inputs.safe_read import file_kind, path_problem, shown_path

# Whether the bytes at a path are the command's own previous output (the path is a regular file).
Recogniser = Callable[[Path], bool]
# Bytes read to recognise an output: markers sit at the start (or, for a PDF, near the end).
_HEAD_BYTES = 64 * 1024


def _head(path: Path, n: int = _HEAD_BYTES) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        return os.read(fd, n)
    finally:
        os.close(fd)


def _tail(path: Path, n: int = _HEAD_BYTES) -> bytes:
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - n))
        return fh.read(n)


def starts_with(*prefixes: bytes) -> Recogniser:
    """An output whose first bytes (after whitespace) are one of ``prefixes``."""
    def recognise(path: Path) -> bool:
        head = _head(path, 4096).lstrip()
        return any(head.startswith(p) for p in prefixes)

    return recognise


def contains(marker: bytes, head_bytes: int = 4096) -> Recogniser:
    """An output holding ``marker`` in its first ``head_bytes``."""
    def recognise(path: Path) -> bool:
        return marker in _head(path, head_bytes)

    return recognise


# A figure Matplotlib wrote, by the file's suffix: the format's first bytes, Matplotlib's name where that format
# keeps it, and the format's last bytes (matplotlib 3.x backends). JPEG, TIFF, WebP and raw keep no name:
# replacing one of those needs --force. (The fuzz run found a text file holding only "matplotlib", then one
# holding only PGF's first line, that passed looser checks.)
_FIGURES: dict[str, tuple[bytes, bytes, bytes]] = {
    ".png": (b"\x89PNG\r\n\x1a\n", b"tEXtSoftware\x00Matplotlib", b"IEND\xaeB`\x82"),
    ".svg": (b"<?xml", b"<dc:title>Matplotlib v", b"</svg>\n"),
    ".pdf": (b"%PDF-", b"/Creator (Matplotlib v", b"%%EOF\n"),
    ".eps": (b"%!PS-Adobe", b"%%Creator: Matplotlib v", b"showpage\n"),
    ".ps": (b"%!PS-Adobe", b"%%Creator: Matplotlib v", b"%%EOF\n"),
    ".pgf": (b"%% Creator: Matplotlib, PGF backend", b"\\begingroup", b"\\endgroup%\n"),
}


def matplotlib_figure(path: Path) -> bool:
    """A figure Matplotlib wrote: PNG, SVG, PDF, EPS, PS or PGF by its suffix, first bytes, Matplotlib's
    signature and last bytes (a file that merely mentions matplotlib is not one)."""
    marks = _FIGURES.get(path.suffix.lower())
    if marks is None:
        return False
    magic, signature, end = marks
    head, tail = _head(path), _tail(path)
    return head.startswith(magic) and (signature in head or signature in tail) and tail.endswith(end)


def chrome_trace(path: Path) -> bool:
    """A trace as sosim/formats/trace.py writes it: compact JSON that opens with its events and closes with
    its otherData (scenario, provenance, ...)."""
    head, tail = _head(path, 64), _tail(path, 1 << 20)
    return (head.startswith(b'{"traceEvents":[') and b'],"displayTimeUnit":"ms","otherData":{"scenario":' in tail
            and tail.endswith(b"}}"))


def json_object_with(key: str, value: str, max_bytes: int = 64 * 1024 * 1024) -> Recogniser:
    """A JSON object whose ``key`` is ``value`` (a sosim check baseline: "format": "sosim-check/1")."""
    def recognise(path: Path) -> bool:
        if path.stat().st_size > max_bytes:
            return False
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and data.get(key) == value

    return recognise


def junit_of_check(path: Path) -> bool:
    """JUnit XML as ``sosim check --junit`` writes it (sosim/answers/check.py junit_xml)."""
    head = _head(path, 4096)
    return head.startswith(b"<?xml") and b"<testsuites>" in head and b'<testsuite name="sosim check ' in head


def json_written_by_sosim(path: Path) -> bool:
    """A DeepSpeed config as sosim writes one: a JSON object, byte for byte ``json.dumps(indent=2)`` plus a
    newline (sosim/formats/dsconfig/emit.py). A hand-written or another tool's config differs in layout."""
    st = path.stat()
    if st.st_size > 4 * 1024 * 1024:
        return False
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and bool(data) and text == json.dumps(data, indent=2) + "\n"


def _same_file(a: os.stat_result, b: str | Path) -> bool:
    try:
        other = os.stat(b)
    except (OSError, ValueError):
        return False
    return (a.st_dev, a.st_ino) == (other.st_dev, other.st_ino)


def target_problem(path: Path, what: str, owned: Recogniser | None, force: bool,
                   inputs: Sequence[str | Path] = ()) -> str | None:
    """Why ``path`` must not be replaced (None: it may be). ``what`` names the output ('sosim check baseline')."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # absent (prepare_output checks the folder above it)
        return None
    except OSError as exc:
        return str(exc.strerror or exc)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link; sosim does not write through links (give the real path)"
    if stat.S_ISDIR(st.st_mode):
        return "is a folder; give a file name"
    if not stat.S_ISREG(st.st_mode):
        return f"is {file_kind(st.st_mode)}; sosim writes regular files only"
    if any(_same_file(st, i) for i in inputs if i):
        return "is an input this command reads; write the output to another file"
    if force:
        return None
    try:
        ours = owned is not None and owned(path)
    except OSError:
        ours = False
    if ours:
        return None
    return f"exists and is not a {what} sosim wrote; pass --force to replace it, or give another name"


def prepare_output(path: str | Path, option: str, what: str, owned: Recogniser | None = None, *,
                   force: bool = False, inputs: Sequence[str | Path] = (), suffixes: Sequence[str] | None = None
                   ) -> Path:
    """Refuse an output path before any work: a bad name, an unwritable folder, a target that must not be
    replaced (see :func:`target_problem`), an unsupported suffix."""
    text = str(path)
    shown = shown_path(text)
    if not text.strip():
        raise SosimError(f"{option}: empty file name")
    problem = path_problem(text)
    if problem is not None:
        raise SosimError(f"{option} {shown}: {problem}")
    out = Path(text)
    problem = target_problem(out, what, owned, force, inputs)
    if problem is not None:
        raise SosimError(f"{option} {shown}: {problem}")
    if suffixes is not None and out.suffix.lower().lstrip(".") not in suffixes:
        raise SosimError(f"{option} {shown}: unsupported file type '{out.suffix or '(none)'}'; use one of "
                         + ", ".join(f".{s}" for s in sorted(suffixes)))
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise SosimError(f"{option} {shown}: {parent} is not a folder")
    probe_problem = _probe(parent)
    if probe_problem:
        raise SosimError(f"{option} {shown}: cannot write: {probe_problem}")
    return out


def _probe(folder: Path) -> str:
    """'' when a file can really be created in ``folder`` (os.access says yes to root on /proc or a read-only
    mount: try it, leaving nothing behind)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".sosim-write-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return str(exc.strerror or exc)
    return ""


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_atomic(path: str | Path, option: str, what: str, write: Callable[[Path], object],
                 owned: Recogniser | None = None, *, force: bool = False,
                 inputs: Sequence[str | Path] = ()) -> Path:
    """Write an output through a temporary file beside ``path`` (same suffix: Matplotlib picks the format by
    it), then rename it over ``path``, checking the target again first (it may have changed during the run).
    ``write(tmp)`` writes the content."""
    out = Path(path)
    shown = shown_path(out)
    problem = target_problem(out, what, owned, force, inputs)
    if problem is not None:
        raise SosimError(f"{option} {shown}: {problem}")
    tmp: Path | None = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{out.stem[:100]}.", suffix=f".tmp{out.suffix}", dir=out.parent)
        os.close(fd)
        tmp = Path(name)
        os.chmod(tmp, _umask_mode())  # mkstemp makes it 0600; an output gets the mode a new file gets
        write(tmp)
        problem = target_problem(out, what, owned, force, inputs)
        if problem is not None:
            raise SosimError(f"{option} {shown}: {problem}")
        os.replace(tmp, out)
        tmp = None
    except OSError as exc:
        raise SosimError(f"{option} {shown}: cannot write: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
    return out


def framework_config(path: Path) -> bool:
    """A torchtitan job or Megatron-LM arguments file as sosim/formats/torchtitan.py and megatron_args.py
    write them: the TOML's first line says so; the arguments are one ``--flag [value]`` a line, joined by
    backslashes, opening with ``--num-layers`` (nothing else in the file)."""
    if path.stat().st_size > 64 * 1024:
        return False
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    if text.startswith("# written by sosim (torchtitan job config"):
        return True
    lines = text.removesuffix("\n").split(" \\\n")
    return (text.startswith("--num-layers ") and text.endswith("\n") and "--use-distributed-optimizer" in lines
            and all(_MEGATRON_LINE.fullmatch(line) for line in lines))


_MEGATRON_LINE = re.compile(r"--[a-z0-9-]+( [^\s\\]+)?")


# The recognisers of sosim's outputs, by what they are.
TRACE = chrome_trace
CHECK_BASELINE = json_object_with("format", "sosim-check/1")
JUNIT = junit_of_check
FIGURE = matplotlib_figure
DS_CONFIG = json_written_by_sosim
FRAMEWORK_CONFIG = framework_config

__all__ = ["CHECK_BASELINE", "DS_CONFIG", "FIGURE", "FRAMEWORK_CONFIG", "JUNIT", "TRACE", "Recogniser", "chrome_trace",
           "contains", "framework_config", "json_object_with", "json_written_by_sosim", "junit_of_check",
           "matplotlib_figure", "prepare_output", "starts_with", "target_problem", "write_atomic"]
