"""Submissions: untrusted `ModelNew` sources. The parent only reads and parses them, never imports them."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from kbverify.errors import InputError


@dataclass(frozen=True)
class Submission:
    id: str
    source: str
    sha256: str
    path: str | None = None


def make_submission(source: str, *, id: str, path: str | None = None) -> Submission:
    return Submission(id=id, source=source, sha256=hashlib.sha256(source.encode()).hexdigest(), path=path)


def load_submission(path: str | Path) -> Submission:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such submission file")
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read submission: {error}") from None
    return make_submission(source, id=path.name, path=str(path))
