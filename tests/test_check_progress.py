"""`check` says what it is doing in a log: a line when a verdict starts, at each new step of it (a worker, a kind of
phase), when it ends, and the heartbeat at least every 20 s while a step runs (kbverify.harness.check_progress)."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from kbverify.core.progress import HEARTBEAT_S, Reporter
from kbverify.harness import check_progress

REPO = Path(__file__).resolve().parent.parent


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _replay(clock: FakeClock) -> tuple[Reporter, io.StringIO]:
    """A check of one submission under two protocols, its sandbox calls replayed on a fake clock."""
    stream = io.StringIO()
    reporter = Reporter(stream, live=False, heartbeat_s=HEARTBEAT_S, clock=clock)
    with check_progress.watching(reporter, total=2, device="cpu") as watcher:
        watcher.plan(["original", "verified"], 1)
        with watcher.verdict("s.py", "original"):
            check_progress.child_started("kernelbench_eval")
            check_progress.child_phase("kernelbench_eval", "reference:timing")
            check_progress.child_phase("kernelbench_eval", "candidate:build:inline")
            clock.now += 54  # a C++ build
            for trial in range(3):
                check_progress.child_phase("kernelbench_eval", f"candidate:correctness:{trial}")
            check_progress.child_phase("kernelbench_eval", "candidate:\x1b[2Jtiming")  # the submission's word
            watcher.finished("passed")
        with watcher.verdict("s.py", "verified"):
            check_progress.child_started("judge")
            for number in range(5):  # the judge's sets, one after another: one line each kind, not each set
                check_progress.child_phase("judge", f"judge:original/x{number}/default/s0")
                check_progress.child_phase("judge", f"judge:compare:original/x{number}/default/s0")
            watcher.finished("incorrect")
    reporter.close()
    return reporter, stream


def test_a_line_per_new_step_and_a_last_line_with_the_count():
    _, stream = _replay(FakeClock())
    lines = stream.getvalue().splitlines()
    steps = [line.split("now: ", 1)[1].split(" · ")[0] for line in lines if "now: " in line]
    assert steps == ["s.py [original] starting", "s.py [original] kernelbench_eval",
                     "s.py [original] kernelbench_eval: reference:timing",
                     "s.py [original] kernelbench_eval: candidate:build",
                     "s.py [original] kernelbench_eval: candidate:correctness",
                     "s.py [original] kernelbench_eval: candidate:??2Jtiming",  # no escape reaches the terminal
                     "s.py [verified] starting", "s.py [verified] judge", "s.py [verified] judge: judge:original",
                     "s.py [verified] judge: judge:compare"]
    assert all(line.startswith("kbverify ") and " check " in line and "\x1b" not in line for line in lines)
    assert "check 1/2 verdicts" in lines[6] and "last: s.py [original] passed" in lines[6]
    assert "check 2/2 verdicts" in lines[-1] and "done in 54 s" in lines[-1] and "[verified] incorrect" in lines[-1]


def test_the_heartbeat_writes_before_20_s_pass_without_a_line():
    clock = FakeClock()
    stream = io.StringIO()
    reporter = Reporter(stream, live=False, heartbeat_s=HEARTBEAT_S, clock=clock)
    reporter._stop.set()  # no ticker thread: the ticks below are the ticker's, on the fake clock
    watcher = check_progress.CheckWatcher(reporter, total=1, device="cpu", clock=clock)
    with watcher.verdict("s.py", "original"):
        check_progress.child_phase("kernelbench_eval", "candidate:correctness:0")  # then a hang: nothing more
        written = []
        for _ in range(200):  # 100 s, a tick at a time as the ticker takes them
            with reporter._lock:
                wait_s = reporter.beat()
            written.append((clock.now, len(stream.getvalue().splitlines())))
            clock.now += wait_s
    times = [1000.0] + [at for (at, count), (_, before) in zip(written[1:], written) if count > before]
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    assert len(gaps) >= 4 and max(gaps) <= HEARTBEAT_S, gaps


@pytest.mark.serial  # it bounds the time between lines: alone on the machine (.ci/run)
@pytest.mark.slow
def test_a_piped_check_of_a_hang_says_so_within_5_s_and_then_every_20_s():
    from tests.test_progress import _lines_with_times

    command = [sys.executable, "-m", "kbverify", "check", "tests/corpus/faults/infinite_loop.py", "--task",
               "tasks/basic/level1/1_ReLU.py", "--protocol", "original", "--device", "cpu", "--hang-floor", "30"]
    arrived, stdout, code = _lines_with_times(command, dict(os.environ), timeout_s=300)
    assert code == 1 and "timeout" in stdout, (stdout, arrived)
    progress = [at for at, line in arrived if line.startswith("kbverify ")]
    assert progress and progress[0] <= 5.0, arrived
    gaps = [later - earlier for earlier, later in zip(progress, progress[1:] + [arrived[-1][0]])]
    assert max(gaps) <= HEARTBEAT_S, (gaps, arrived)
    assert any("candidate:correctness" in line for _, line in arrived)
    assert "check 1/1 verdicts" in [line for _, line in arrived if line.startswith("kbverify ")][-1]


def test_a_check_says_it_started_before_it_probes_the_device(capsys):
    """`--device auto` asks a worker (seconds, more on a GPU host): the first line is written before that."""
    from types import SimpleNamespace

    from kbverify.cli import app as cli
    from kbverify.harness import runner

    seen_before_probe = []

    def options():
        seen_before_probe.append(capsys.readouterr().err)
        return runner.CheckOptions(device="cpu")

    assert cli._judged(SimpleNamespace(submissions=[], protocols=[], device="auto"), options) == []
    (lines,) = seen_before_probe
    assert lines.startswith("kbverify ") and "finding the device (--device auto)" in lines
