"""kbverify.timing.process_tree: the candidate's whole tree is stopped while the reference's batch runs (corpus
exploits/matmul_burners_pad_the_reference_share_from_forks), and continued after, grandchildren included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from kbverify.timing import process_tree

# A process that forks a grandchild; both spin, so a stopped one is told from a running one by its CPU time.
_TREE = """
import os, time
os.fork()
end = time.monotonic() + 60
while time.monotonic() < end:
    pass
"""


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _tree():
    root = subprocess.Popen([sys.executable, "-c", _TREE])
    deadline = time.monotonic() + 10
    while len(process_tree.descendants(root.pid)) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    return root


def test_every_process_of_the_tree_is_stopped_and_continued():
    root = _tree()
    try:
        pids = [root.pid, *process_tree.descendants(root.pid)]
        assert len(pids) == 2
        stopped = process_tree.stop(root.pid)
        assert sorted(stopped) == sorted(pids)
        before = {pid: _cpu_ticks(pid) for pid in pids}
        time.sleep(0.3)
        assert {pid: _cpu_ticks(pid) for pid in pids} == before  # nothing of the tree ran while stopped
        process_tree.resume(stopped)
        time.sleep(0.3)
        assert all(_cpu_ticks(pid) > before[pid] for pid in pids)  # the honest twin: all of it runs again
    finally:
        for pid in process_tree.descendants(root.pid):
            os.kill(pid, signal.SIGKILL)
        root.kill()
        root.wait()


def test_a_tree_that_is_gone_stops_nothing():
    root = subprocess.Popen([sys.executable, "-c", "pass"])
    root.wait()
    assert process_tree.stop(root.pid) == []
