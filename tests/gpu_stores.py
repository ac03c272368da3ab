"""The SQLite stores of real GPU runs that the tests replay, kept in one xz archive (`tests/data/gpu_stores.tar.xz`,
its members named `<session>/<store>.sqlite`; `tests/data/gpu_stores.manifest.json` lists each member's size and
sha256). One archive rather than a file per store: xz finds the rejudged stores' records in their originals, 3.6 MB
in all where the gzipped stores took 8.4 MB. The archive is unpacked once per test process, on first use."""

from __future__ import annotations

import atexit
import functools
import shutil
import tarfile
import tempfile
from pathlib import Path

ARCHIVE = Path(__file__).resolve().parent / "data" / "gpu_stores.tar.xz"


@functools.lru_cache(maxsize=1)
def _unpacked() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="kbverify-gpu-stores-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    with tarfile.open(ARCHIVE, "r:xz") as archive:
        archive.extractall(folder, filter="data")
    return folder


def names() -> list[str]:
    """Every stored GPU store, as the archive names it."""
    with tarfile.open(ARCHIVE, "r:xz") as archive:
        return sorted(member.name for member in archive.getmembers() if member.isfile())


def copy_store(name: str, target: Path) -> Path:
    """A private copy of the store `name` at `target` (a test may write to the store it opens)."""
    shutil.copyfile(_unpacked() / name, target)
    return target
