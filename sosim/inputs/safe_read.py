"""The one reader of every file sosim opens: regular files only, a size cap, UTF-8, located errors.

Why one reader: a named pipe blocks its reader until a writer comes (``sosim run fifo.yaml`` hung for ever),
a character device (``/dev/zero``) never ends, a name the file system refuses (300 characters, a NUL byte)
raises errors that are not about the input's content. Whatever route a file takes into sosim (a scenario,
a profile by name, a list of calibration tables in ``--set``, a ``check`` baseline, a sweep's ``--resume``
file, a DeepSpeed or Hugging Face config), it is opened here:

- the name is checked first (empty, NUL byte, longer than the file system allows) without touching the disk;
- ``os.stat`` says what the path is *before* it is opened: anything but a regular file is refused by kind
  (a FIFO is never opened, so nothing blocks);
- the file is opened with ``O_NONBLOCK`` (a FIFO swapped in between stat and open cannot block either) and
  checked again on the open descriptor, then read up to the cap plus one byte;
- text must be UTF-8; a bad byte is reported with its line.

Every problem is a :class:`ConfigError` whose line starts with the path, as every other input error does.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from sosim.inputs.errors import ConfigError

# A scenario or profile is a few KB and a sweep file with explicit points perhaps a few MB: anything larger
# is not one of them (sosim/run/loader.py MAX_YAML_BYTES is this number).
MAX_INPUT_BYTES = 16 * 1024 * 1024
# Calibration tables are tens of KB (calibration/*/measurements.csv); a larger file is not one.
MAX_TABLE_BYTES = 64 * 1024 * 1024
# Linux: a path component is at most NAME_MAX = 255 bytes and a path at most PATH_MAX = 4096 (limits.h);
# past them open() fails with ENAMETOOLONG, which is the name's fault, not a missing file.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096
# Characters of a path shown in a message: a 5,000-character name must not fill the screen.
MAX_SHOWN_PATH = 200

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def shown_path(path: str | Path) -> str:
    """A path as messages show it: control characters escaped (one line), a long one cut."""
    text = str(path)
    if not text:
        return "''"
    if not text.isprintable():
        text = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    if len(text) <= MAX_SHOWN_PATH:
        return text
    return f"{text[:MAX_SHOWN_PATH - 40]}...({len(str(path))} characters)"


def path_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot name a file at all (None: it can). No disk access."""
    text = str(path)
    if not text.strip():
        return "empty path: give a file name"
    if "\0" in text:
        return "the path contains a NUL character, which no file name can hold"
    try:
        raw = os.fsencode(text)
    except UnicodeEncodeError:
        return "the path is not valid in this system's file name encoding"
    if len(raw) > MAX_PATH_BYTES:
        return f"a path of {len(raw):,} bytes is longer than the file system allows ({MAX_PATH_BYTES:,})"
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > MAX_NAME_BYTES:
        return (f"a file name of {longest:,} bytes is longer than the file system allows "
                f"({MAX_NAME_BYTES} per name)")
    return None


def file_kind(mode: int) -> str:
    """'a folder', 'a named pipe (FIFO)', ... for a mode that is not a regular file's."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _stat(path: str | Path, follow: bool = True) -> os.stat_result | None:
    if path_problem(path) is not None:
        return None
    try:
        return os.stat(path) if follow else os.lstat(path)
    except (OSError, ValueError):
        return None


def exists(path: str | Path) -> bool:
    """``Path.exists`` that answers False (not an exception) for a name the file system refuses."""
    return _stat(path) is not None


def is_file(path: str | Path) -> bool:
    st = _stat(path)
    return st is not None and stat.S_ISREG(st.st_mode)


def is_dir(path: str | Path) -> bool:
    st = _stat(path)
    return st is not None and stat.S_ISDIR(st.st_mode)


def read_bytes(path: str | Path, what: str = "file", max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; anything else is a ConfigError naming the path."""
    shown = shown_path(path)
    problem = path_problem(path)
    if problem is not None:
        raise ConfigError([f"{shown}: cannot read {what}: {problem}"])
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError([f"{shown}: cannot read {what}: {_reason(exc)}"]) from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError([f"{shown}: cannot read {what}: it is {file_kind(st.st_mode)}, not a regular file"])
    if st.st_size > max_bytes:
        raise ConfigError([f"{shown}: larger than {_size(max_bytes)}: not a {what} sosim reads"])
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise ConfigError([f"{shown}: cannot read {what}: {_reason(exc)}"]) from None
    try:
        st = os.fstat(fd)  # what was opened, not what was stat'ed: a swap in between is caught here
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError([f"{shown}: cannot read {what}: it is {file_kind(st.st_mode)}, not a regular file"])
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise ConfigError([f"{shown}: cannot read {what}: {_reason(exc)}"]) from None
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    if len(raw) > max_bytes:  # grew while being read
        raise ConfigError([f"{shown}: larger than {_size(max_bytes)}: not a {what} sosim reads"])
    return raw


def decode_text(raw: bytes, origin: str) -> str:
    """UTF-8 (with or without a byte-order mark), or a message naming the line of the first bad byte."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError([f"{origin}:{line}: not UTF-8 text: byte 0x{raw[exc.start]:02x}; save the file as UTF-8 "
                           "(iconv -f latin1 -t utf-8 converts a Latin-1 file)"]) from None


def read_text(path: str | Path, what: str = "file", max_bytes: int = MAX_INPUT_BYTES) -> str:
    """A regular text file of at most ``max_bytes``, decoded as UTF-8; problems become a ConfigError."""
    return decode_text(read_bytes(path, what, max_bytes), shown_path(path))


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        return "the name is longer than the file system allows"
    return str(exc.strerror or exc)


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 else f"{n:,} bytes"


__all__ = ["MAX_INPUT_BYTES", "MAX_TABLE_BYTES", "decode_text", "exists", "file_kind", "is_dir", "is_file",
           "path_problem", "read_bytes", "read_text", "shown_path"]
