"""Pack GPU sessions' raw records out of the working tree: one xz archive per GPU run date.

    python3 scripts/archive_results.py results/h100-2026-12-07 results/gpu-2026-12-07-s20 [--drop 'GLOB' ...]

Each folder's files go into `results/archive/<date>.tar.xz` (the date is the first YYYY-MM-DD in the folder's
name), beside what that archive already holds; the folders are then deleted. `results/archive/manifest.json` lists
every member (name, size, sha256) of every archive, and every file `--drop` left out (a glob on the path under
results/, e.g. '*.partial.jsonl.gz') with its size, sha256 and the commit that still holds it, so `git show
COMMIT:results/PATH` brings it back. Rule: raw records no reader needs do not stay in the checkout (issue 38), but
nothing is lost without a trail. Run it on a clean tree: the commit recorded for a dropped file is HEAD's."""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import io
import json
import lzma
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
ARCHIVE = RESULTS / "archive"
MANIFEST = ARCHIVE / "manifest.json"


def _date(folder: Path) -> str:
    found = re.search(r"\d{4}-\d{2}-\d{2}", folder.name)
    if not found:
        raise SystemExit(f"{folder}: no YYYY-MM-DD in its name")
    return found.group(0)


def _members(archive: Path) -> dict[str, bytes]:
    """What an archive already holds (an empty dict where there is none yet)."""
    if not archive.exists():
        return {}
    with tarfile.open(archive, "r:xz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _write(archive: Path, members: dict[str, bytes]) -> None:
    """Members sorted by name, owner and time zeroed: the same files give the same bytes."""
    partial = archive.with_name(archive.name + ".tmp")
    with tarfile.open(partial, "w:xz", preset=9 | lzma.PRESET_EXTREME) as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(members[name]), 0o644
            tar.addfile(info, io.BytesIO(members[name]))
    partial.replace(archive)


def _entry(name: str, data: bytes) -> dict:
    return {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--drop", action="append", default=[], help="glob of files left out (path under results/)")
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=RESULTS, check=True).stdout.strip()
    ARCHIVE.mkdir(exist_ok=True)
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {"archives": {}, "dropped": []}
    by_date: dict[str, list[Path]] = {}
    for folder in args.folders:
        by_date.setdefault(_date(folder.resolve()), []).append(folder.resolve())
    for date, folders in sorted(by_date.items()):
        archive = ARCHIVE / f"{date}.tar.xz"
        members = _members(archive)
        for folder in folders:
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                name, data = path.relative_to(RESULTS).as_posix(), path.read_bytes()
                if any(fnmatch.fnmatch(name, pattern) for pattern in args.drop):
                    manifest["dropped"].append({**_entry(name, data), "git": head})
                else:
                    members[name] = data
        _write(archive, members)
        manifest["archives"][archive.name] = {
            "size": archive.stat().st_size, "sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
            "members": [_entry(name, members[name]) for name in sorted(members)]}
        for folder in folders:
            shutil.rmtree(folder)
        print(f"{archive.relative_to(RESULTS.parent)}: {len(members)} files, {archive.stat().st_size} bytes")
    manifest["dropped"].sort(key=lambda entry: entry["name"])
    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
