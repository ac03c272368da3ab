"""Submissions: untrusted `ModelNew` sources. The parent only reads and parses them, never imports them."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from kbverify.core.errors import InputError


@dataclass(frozen=True)
class Submission:
    id: str
    source: str
    sha256: str
    path: str | None = None


def make_submission(source: str, *, id: str, path: str | None = None) -> Submission:
    return Submission(id=id, source=source, sha256=hashlib.sha256(source.encode()).hexdigest(), path=path)


def read_source(path: str | Path) -> str:
    """A Python file's text as Python itself reads it (`tokenize.open`): a UTF-8 byte-order mark is dropped and a
    PEP 263 coding line is honoured, so a file that runs as a script reads as that same source here. Raises
    OSError, or UnicodeDecodeError / SyntaxError where the bytes are not text in the encoding the file declares."""
    import io
    import tokenize

    with open(path, "rb") as handle:
        data = handle.read()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    text = data.decode(encoding)
    # utf-8-sig drops the mark; a mark beside a coding line that names utf-8 is dropped by Python too
    return text[1:] if text.startswith("\ufeff") else text


def load_submission(path: str | Path) -> Submission:
    path = Path(path)
    try:
        is_file = path.is_file()
    except OSError as error:
        raise InputError(f"{path}: cannot read submission: {error.strerror or error}") from None
    if not is_file:
        raise InputError(f"{path}: no such submission file")
    try:
        source = read_source(path)
    except (OSError, UnicodeDecodeError, SyntaxError, LookupError) as error:
        raise InputError(f"{path}: cannot read submission: {_reason(error)}") from None
    return make_submission(source, id=path.name, path=str(path))


def _reason(error: Exception) -> str:
    if isinstance(error, OSError):
        return error.strerror or str(error)
    if isinstance(error, SyntaxError):  # detect_encoding: an unknown coding, or bytes that are not UTF-8
        return error.msg
    return str(error)
