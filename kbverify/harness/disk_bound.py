"""The bound on a job's build folders, which outlive it on the host's disk (the build cache).

A job's scratch, temporary folders and /dev/shm are bounded tmpfs (kbverify.harness.confine); its build folders cannot be,
since what a build makes there is kept for the next run. So the parent measures them after every job that ran
submission code: a folder over the bound is emptied at once (what the job wrote there, beyond a build, is not
left to fill the disk for whoever builds next), and the job's outcome says so, which makes it the candidate's
failure. A later build that still meets a full disk is confirmed as the machine's by a probe build in a fresh
folder (kbverify.harness.toolchain), never blamed on its submission.
"""

from __future__ import annotations

import os
import shutil

LIMIT_ENV = "KBVERIFY_BUILD_DIR_LIMIT"
DEFAULT_LIMIT_BYTES = 2 << 30


def limit_bytes() -> int:
    given = os.environ.get(LIMIT_ENV, "").strip()
    return int(given) if given.isdigit() and int(given) > 0 else DEFAULT_LIMIT_BYTES


def used_bytes(root: str, stop_after: int) -> int:
    """The disk a folder's tree takes (allocated blocks: a sparse file counts what it holds), links not
    followed; the walk stops once past `stop_after`."""
    total = 0
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
        if total > stop_after:
            break
    return total


def enforce(folders: list[str]) -> str:
    """Empty each folder over the bound; "" when none was, else what was found (for the job's outcome)."""
    limit, found = limit_bytes(), []
    for folder in folders:
        if not os.path.isdir(folder) or os.path.islink(folder):
            continue
        used = used_bytes(folder, limit)
        if used > limit:
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder, exist_ok=True)
            found.append(f"{os.path.basename(folder)}: more than {used >> 20} MiB (bound {limit >> 20} MiB)")
    return "; ".join(found)
