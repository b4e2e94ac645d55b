"""``sosim sweep --out FILE [--resume]``: what may be at FILE, and reading it back before anything is written.

Why a module: ``--resume`` used to cut the last line of whatever file it was given before checking that it
was a sweep's output (``printf 'my notes' > notes.csv`` lost the notes), and a damaged output (a blank line,
a byte that is not UTF-8, an unterminated quote, a FIFO) stopped with an internal error. Here the whole file is
read through the one bounded reader (sosim/inputs/safe_read.py) and validated first: the header must be this
sweep's columns, every record complete and well quoted, every point id an id. Only then may the partial last
line a crash leaves behind be cut (the file is then recognisably this sweep's). Problems are ``file:line:
message``, exit 2, and the file is left as it was.
"""

from __future__ import annotations

import csv
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

from sosim.inputs.errors import ConfigError, SosimError
from sosim.inputs.safe_read import decode_text, file_kind, path_problem, read_bytes, shown_path

# A sweep output is about a kilobyte per point: 2 GiB holds millions of points, more than any sweep runs.
MAX_RESUME_BYTES = 2 * 1024**3
# point_id(): the first 16 hex digits of a SHA-1 (sosim/answers/sweep.py).
_POINT_ID = re.compile(r"[0-9a-f]{16}")


def check_out_target(path: Path, parquet: bool) -> None:
    """Refuse an --out that sosim must not write into: a bad name, a link, a device, a FIFO, a socket, or a
    file where a Parquet folder goes (and a folder where a CSV file goes)."""
    shown = shown_path(path)
    problem = path_problem(str(path))
    if problem is not None:
        raise SosimError(f"--out {shown}: {problem}")
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # absent: the folder above it is checked by the caller
        return
    except OSError as exc:
        raise SosimError(f"--out {shown}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise SosimError(f"--out {shown}: is a symbolic link; sosim does not write through links (give the real "
                         "path)")
    expected = stat.S_ISDIR if parquet else stat.S_ISREG
    if not expected(st.st_mode):
        what = "a folder of Parquet part files" if parquet else "a regular file"
        raise SosimError(f"--out {shown}: is {file_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'a file'}, "
                         f"not {what}; give another --out")


def check_parts(folder: Path) -> None:
    """Every part file of a Parquet output is a regular file (pyarrow would block on a FIFO)."""
    for entry in folder.iterdir():
        st = os.lstat(entry)
        if entry.name.startswith("part-") and not stat.S_ISREG(st.st_mode):
            raise SosimError(f"--out {shown_path(folder)}: {entry.name} is {file_kind(st.st_mode)}, not a part "
                             "file sosim wrote; use another --out")


def read_done_csv(path: Path, columns: Sequence[str]) -> tuple[set[str], int | None]:
    """The point ids an earlier run of this sweep wrote to ``path``, and where to cut a partial last line
    (None: nothing to cut). Raises ConfigError (``file:line: message``) for anything that is not this sweep's
    output; nothing is written here."""
    shown = shown_path(path)
    raw = read_bytes(path, "sweep output", MAX_RESUME_BYTES)
    if not raw:
        return set(), None
    end = raw.rfind(b"\n") + 1
    if end == 0:  # not even a complete header line: a crash cannot leave that behind once a row was written
        raise ConfigError([f"{shown}:1: not the output of this sweep (no header line); use another --out"])
    try:
        decode_text(raw, shown)  # every byte UTF-8, or the line of the first that is not
    except ConfigError as exc:
        raise ConfigError([f"{exc.problems[0]}; not the output of this sweep: use another --out"]) from None
    complete = raw[:end].decode("utf-8-sig")
    cut = end if end < len(raw) else None
    reader = csv.reader(complete.splitlines(keepends=True), strict=True)
    try:
        header = next(reader)
    except csv.Error as exc:
        raise ConfigError([f"{shown}:1: not a CSV file of an earlier sweep ({exc}); use another --out"]) from None
    if header != list(columns):
        raise ConfigError([f"{shown}:1: its columns differ from this sweep's (expected {','.join(columns)[:200]}); "
                           "use another --out"])
    ids: set[str] = set()
    while True:
        start = reader.line_num + 1  # where the next record begins (a quoted field may span lines)
        try:
            record = next(reader, None)
        except csv.Error as exc:
            raise ConfigError([f"{shown}:{start}: not a well-formed CSV record ({exc}); the file is damaged: use "
                               "another --out"]) from None
        if record is None:
            break
        if not record:  # the csv module's blank line (a line break inside quotes is part of a field)
            raise ConfigError([f"{shown}:{start}: a blank line: not how sosim writes a sweep's rows; use another "
                               "--out (or delete the line)"])
        if len(record) != len(header):
            raise ConfigError([f"{shown}:{start}: {len(record)} field(s) where the header has {len(header)}; the file "
                               "is damaged: use another --out"])
        if not _POINT_ID.fullmatch(record[0]):
            raise ConfigError([f"{shown}:{start}: point_id: {record[0][:40]!r} is not a point id sosim wrote; use "
                               "another --out"])
        ids.add(record[0])
    return ids, cut


__all__ = ["MAX_RESUME_BYTES", "check_out_target", "check_parts", "read_done_csv"]
