"""A worker's whole process tree, stopped and continued by the parent (parent side; no torch).

The reference's timing batches run in a worker of their own, but on the machine the candidate's worker shares:
any process of the candidate's (a fork, a native thread's host process, a helper it spawned) that runs while the
reference is timed takes CPU from it and pads the reference's share of the parent's clock, which is what confirms
the candidate's own times (corpus exploits/matmul_burners_pad_the_reference_share_from_forks: 6.7-8x for a true
1x). So while the reference's batch runs, nothing of the candidate's runs: every process below its supervisor is
stopped (SIGSTOP, which no process can catch or ignore) and continued after. The tree is read from
/proc/PID/task/TID/children, walked again until a pass finds no process left running: a process forked between
two passes is found by the next, and none can fork once its parent is stopped.
"""

from __future__ import annotations

import os
import signal
import time

_PASSES = 8  # a tree that keeps growing past this many passes is still stopped as far as it was found


def descendants(root: int) -> list[int]:
    """Every process below `root` (not `root` itself), parents before their children."""
    found, queue = [], [root]
    while queue:
        pid = queue.pop(0)
        for child in _children(pid):
            if child not in found:
                found.append(child)
                queue.append(child)
    return found


def stop(root: int) -> list[int]:
    """Stop `root` and every process below it; the pids stopped, for `resume`. Processes that are gone by the time
    they are signalled are skipped."""
    stopped: list[int] = []
    for _ in range(_PASSES):
        pending = [pid for pid in [root, *descendants(root)] if pid not in stopped]
        if not pending:
            break
        for pid in pending:
            if _signal(pid, signal.SIGSTOP):
                stopped.append(pid)
    _until_stopped(stopped)
    return stopped


def resume(stopped: list[int]) -> None:
    """Continue what `stop` stopped, children first, so no parent runs before the processes it waits on."""
    for pid in reversed(stopped):
        _signal(pid, signal.SIGCONT)


def _until_stopped(pids: list[int], timeout_s: float = 0.05) -> None:
    """A signal is delivered when the process is next scheduled: wait (briefly) until each says it is stopped."""
    deadline = time.monotonic() + timeout_s
    waiting = list(pids)
    while waiting and time.monotonic() < deadline:
        waiting = [pid for pid in waiting if _state(pid) not in ("T", "t", "Z", "X", "")]


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                out.extend(int(word) for word in handle.read().split())
        except (OSError, ValueError):
            continue
    return out


def _signal(pid: int, number: int) -> bool:
    try:
        os.kill(pid, number)
        return True
    except (ProcessLookupError, PermissionError):
        return False
