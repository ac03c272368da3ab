"""Build kbverify/data/kernelbench_reference_hashes.json from a local KernelBench git checkout.

    python3 scripts/build_reference_hashes.py KERNELBENCH_GIT_DIR [--ref main --ref v0 --ref v0.1] [--history]

Reads task files (`KernelBench/levelL/ID_Name.py`) at the tip of each ref, and with --history at every commit of
each ref that touched them, through `git` only: nothing is downloaded and no KernelBench code is copied, only
normalised hashes. A version at a ref's tip is labelled with the ref's name; an older one with `ref@commit`
(the newest commit of that ref that still had it).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kbverify.rescore.references import NORMALIZATION_VERSION, normalized_hash, reference_key  # noqa: E402

TASK_PATH = re.compile(r"^KernelBench/level(?P<level>\d+)/(?P<id>\d+)_[^/]+\.py$")
DEFAULT_REFS = ("main", "v0", "v0.1")


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, text=True).stdout


def task_blobs(git_dir: str, commit: str) -> dict[str, str]:
    """reference key → blob id of its task file at `commit`."""
    blobs = {}
    for line in git(git_dir, "ls-tree", "-r", commit, "--", "KernelBench/").splitlines():
        meta, path = line.split("\t", 1)
        match = TASK_PATH.match(path)
        if match:
            blobs[reference_key(int(match["level"]), int(match["id"]))] = meta.split()[2]
    return blobs


def read_blobs(git_dir: str, blob_ids: set[str]) -> dict[str, str]:
    """Blob contents in one `git cat-file --batch` call: a few thousand blobs, one process."""
    ordered = sorted(blob_ids)
    raw = subprocess.run(["git", f"--git-dir={git_dir}", "cat-file", "--batch"], check=True, capture_output=True,
                         input="\n".join(ordered).encode() + b"\n").stdout
    contents, offset = {}, 0
    for blob_id in ordered:
        header_end = raw.index(b"\n", offset)
        size = int(raw[offset:header_end].split()[2])
        start = header_end + 1
        contents[blob_id] = raw[start:start + size].decode("utf-8", errors="replace")
        offset = start + size + 1
    return contents


def build(git_dir: str, refs: list[str], history: bool) -> dict:
    # (key, blob) → labels, newest first; a ref's commits come newest first from git log.
    labels: dict[tuple[str, str], list[str]] = {}
    sources = {}
    for ref in refs:
        tip = git(git_dir, "rev-parse", "--verify", f"{ref}^{{commit}}").strip()
        sources[ref] = tip
        commits = [tip]
        if history:
            commits += [c for c in git(git_dir, "log", "--format=%H", tip, "--", "KernelBench/").split() if c != tip]
        seen_on_ref: set[tuple[str, str]] = set()
        for commit in commits:
            for key, blob in task_blobs(git_dir, commit).items():
                if (key, blob) in seen_on_ref:
                    continue
                seen_on_ref.add((key, blob))
                label = ref if commit == tip else f"{ref}@{commit[:7]}"
                labels.setdefault((key, blob), []).append(label)
    contents = read_blobs(git_dir, {blob for _, blob in labels})
    tasks: dict[str, dict[str, list[str]]] = {}
    for (key, blob), where in labels.items():
        digest = normalized_hash(contents[blob])
        if digest is None:
            print(f"skipped {key} blob {blob[:7]}: does not parse", file=sys.stderr)
            continue
        merged = tasks.setdefault(key, {}).setdefault(digest, [])
        merged.extend(label for label in where if label not in merged)
    ordered = {key: tasks[key] for key in sorted(tasks, key=_key_order)}
    return {"normalization_version": NORMALIZATION_VERSION, "source": "ScalingIntelligence/KernelBench",
            "refs": sources, "history": history, "tasks": ordered}


def _key_order(key: str) -> tuple[int, int]:
    level, problem_id = key.removeprefix("level").split("/")
    return int(level), int(problem_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("git_dir", help="a KernelBench git directory (bare or .git)")
    parser.add_argument("--ref", action="append", dest="refs", help="branch, tag or commit (repeatable)")
    parser.add_argument("--history", action="store_true", help="also every older version on each ref")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "kbverify/data/kernelbench_reference_hashes.json")
    args = parser.parse_args()
    refs = args.refs or list(DEFAULT_REFS)
    data = build(args.git_dir, refs, args.history)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    versions = sum(len(v) for v in data["tasks"].values())
    print(f"{args.out}: {len(data['tasks'])} tasks, {versions} versions from {', '.join(refs)}")


if __name__ == "__main__":
    main()
