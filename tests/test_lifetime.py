"""Nothing of a `kbverify` command outlives it: however it ends (SIGTERM from `timeout`, SIGINT, SIGHUP from a
closed terminal, SIGKILL), its worker server, the resource tracker, the supervisors and the jobs running submission
code are gone within 5 s. Found by a marker in their environment and by ancestry taken just before the signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from kbverify.harness import gpu_processes
from kbverify.harness.mps_lifetime import process_start_time

REPO = Path(__file__).resolve().parent.parent
GONE_WITHIN_S = 5.0


def _alive(marker: str, known: dict[int, str]) -> list[int]:
    """Live processes with the marker in their environment, or among `known` (pid → start time) and not reused."""
    found = [pid for pid, started in known.items() if process_start_time(pid) == started]
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in found:
            try:
                environ = Path(f"/proc/{name}/environ").read_bytes()
            except OSError:
                continue
            if marker.encode() in environ and process_start_time(int(name)) is not None:
                found.append(int(name))
    return sorted(found)


def _run_until_hanging(marker: str) -> subprocess.Popen:
    """`kbverify check` on a forward that never returns, with only --timeout to end it, once the hang has begun."""
    command = [sys.executable, "-m", "kbverify", "check", "tests/corpus/faults/infinite_loop.py", "--task",
               "tasks/basic/level1/1_ReLU.py", "--protocol", "original", "--device", "cpu", "--hang-floor", "0",
               "--timeout", "300"]
    cli = subprocess.Popen(command, cwd=REPO, env={**os.environ, marker: "1"}, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    for line in cli.stderr:  # the progress lines (kbverify.harness.check_progress) say when the forward runs
        if "candidate:correctness" in line or time.monotonic() > deadline:
            break
    time.sleep(0.5)
    assert cli.poll() is None, "the check ended before its forward hung"
    return cli


@pytest.mark.serial  # it bounds how long the processes take to go: alone on the machine (.ci/run)
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL],
                         ids=lambda s: signal.Signals(s).name)
def test_no_process_of_a_check_outlives_it(signum):
    marker = f"KBV_LIFETIME_{uuid.uuid4().hex}"
    cli = _run_until_hanging(marker)
    try:
        known = {pid: process_start_time(pid) for pid in gpu_processes.descendants(cli.pid)}
        assert len(known) >= 4, known  # the command, the worker server, a supervisor, the job (and its init)
        os.kill(cli.pid, signum)  # the command alone, as `timeout` does
        signalled = time.monotonic()
        cli.wait(timeout=30)
        while _alive(marker, known) and time.monotonic() - signalled < GONE_WITHIN_S:
            time.sleep(0.1)
        left = _alive(marker, known)
        assert not left, [(pid, Path(f"/proc/{pid}/cmdline").read_bytes()[:120]) for pid in left]
    finally:
        for pid in _alive(marker, {}):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        cli.stderr.close()
