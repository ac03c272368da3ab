"""Input validation of paths: a file or folder an option names exists and can be read, and one an output goes
into can be made (kbverify.cli.validate calls these before any work starts).

A folder an output goes into (or the nearest of its ancestors that exists) is probed by making and removing one
empty folder in it: permission bits say nothing about `/proc`, `/sys` or a read-only mount, where the command
would otherwise fail only when it writes.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from kbverify.core.errors import InputError

_REPORT_FILES = ("report.json", "report.md", "report.html")


def readable(path: Path | None, what: str) -> None:
    """A path the system can look up at all: not a name too long for its file system, not through a folder that
    cannot be searched or a symlink loop (pathlib's exists() raises for these instead of saying False)."""
    if path is None:
        return
    if not str(path):
        raise InputError(f"{what}: an empty path")
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass  # missing (or under a file): each command says what it expected there
    except OSError as error:
        raise InputError(f"{what} {_short(path)}: {error.strerror or error}") from None
    except ValueError as error:  # an embedded NUL
        raise InputError(f"{what} {_short(path)}: {error}") from None


def _short(path: Path, width: int = 120) -> str:
    text = str(path)
    return text if len(text) <= width else f"{text[:width // 2]}...{text[-width // 2:]}"


def _leads_nowhere(path: Path, option: str) -> None:
    """A symlink loop, or a link to nothing: exists() calls it missing, while opening or creating through it
    fails (ELOOP, or a file made somewhere the user did not name)."""
    readable(path, option)
    if path.is_symlink() and not path.exists():
        raise InputError(f"{option} {path}: a symlink that leads nowhere (a loop, or its target is missing)")


def existing(path: Path, what: str, expected: str, *, file: bool = False) -> None:
    _leads_nowhere(path, what)
    if not path.exists():
        raise InputError(f"{path}: no such file or folder ({what}: {expected})")
    if file and not path.is_file():
        raise InputError(f"{path}: not a file ({what}: {expected})")
    if not (path.is_file() or path.is_dir()):  # a FIFO would block the read, a device read forever or nothing
        raise InputError(f"{path}: neither a regular file nor a folder ({what}: {expected})")


def folder(path: Path, option: str) -> None:
    _leads_nowhere(path, option)
    if not path.is_dir():
        raise InputError(f"{option} {path}: no such folder")


def folder_to_write(path: Path, option: str) -> None:
    """A folder that exists, or can be made: never an existing file, nor under one."""
    _leads_nowhere(path, option)
    if path.exists() and not path.is_dir():
        raise InputError(f"{option} {path}: exists and is not a folder")
    _creatable(path, option)


def report_folder(path: Path, option: str) -> None:
    folder_to_write(path, option)
    for name in _REPORT_FILES:
        if (path / name).is_dir():
            raise InputError(f"{option} {path}: {name} there is a folder; the report cannot be written")


def output_file(path: Path, option: str) -> None:
    """A file that may exist (a store to resume) or can be made."""
    _leads_nowhere(path, option)
    if path.is_dir():
        raise InputError(f"{option} {path}: a folder, not a file")
    readable(path, option)
    _creatable(path.parent, option, given=path)


def _creatable(path: Path, option: str, *, given: Path | None = None) -> None:
    """`path` is a folder that exists or can be made (`given`: the path named on the command line, for the
    message: a file to be made in `path`)."""
    readable(path, option)
    ancestor, shown = path, given if given is not None else path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(f"{option} {_short(shown)}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InputError(f"{option} {_short(shown)}: {ancestor} is not writable")
    _names_fit(shown, ancestor, option)
    _probe(shown, ancestor, option)


def _names_fit(path: Path, ancestor: Path, option: str) -> None:
    """Every folder or file still to be made has a name its file system takes."""
    try:
        longest = os.pathconf(ancestor, "PC_NAME_MAX")
    except (OSError, ValueError):
        longest = 255
    to_make = path.relative_to(ancestor).parts if path != ancestor else ()
    for name in to_make:
        if len(os.fsencode(name)) > longest:
            raise InputError(f"{option} {_short(path)}: the name {name[:40]}... is longer than the {longest} bytes "
                             f"a file name may have there")


def _probe(path: Path, ancestor: Path, option: str) -> None:
    """Make and remove one empty folder in `ancestor`: the only sure test that something can be created there
    (root passes every permission check, and /proc, /sys or a read-only mount still refuse)."""
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".kbverify-probe-", dir=ancestor))
    except OSError as error:
        reason = "a read-only file system" if error.errno == errno.EROFS else (error.strerror or str(error))
        raise InputError(f"{option} {_short(path)}: nothing can be created in {ancestor} ({reason}); "
                         f"give a path in a writable folder") from None
