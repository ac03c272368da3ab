"""Progress that works everywhere: a live bar in a terminal, and in a log (stderr not a terminal) a plain line at
every phase change and at least every 30 s, with counts, the rate and an estimate that names the right device."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kbverify.core.progress import HEARTBEAT_S, MIN_FINISHED, Progress, Reporter, estimate_left_s, where

pytestmark = pytest.mark.serial  # it bounds the time between progress lines: alone on the machine (.ci/run)

REPO = Path(__file__).resolve().parent.parent
LOG_GAP_LIMIT_S = 30.0


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def plain(clock: FakeClock, heartbeat_s: float = 3600.0) -> tuple[Reporter, io.StringIO]:
    stream = io.StringIO()
    return Reporter(stream, live=False, heartbeat_s=heartbeat_s, clock=clock), stream


def test_a_plain_line_at_each_phase_change_and_a_last_line_at_the_end():
    clock = FakeClock()
    reporter, stream = plain(clock)
    with reporter:
        reporter(Progress(0, 4, phase="start", device="cpu"))
        reporter(Progress(0, 2, phase="build", device="cpu", workers=2))
        clock.now += 30
        reporter(Progress(1, 2, eta_s=30.0, last="a.py built", phase="build", workers=2))
        reporter(Progress(2, 2, eta_s=0.0, last="b.py built", phase="build", workers=2))
        reporter(Progress(0, 4, 1, phase="evaluate", device="cpu"))
        clock.now += 10
        reporter(Progress(4, 4, 1, 0.0, "level1/4/s0 [verified] incorrect", phase="evaluate", device="cpu"))
    lines = stream.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["build", "build", "evaluate", "evaluate"]
    assert "0/2 native builds" in lines[0] and "on 2 CPU cores" in lines[0]
    assert "2/2 native builds" in lines[1] and "done in 30 s" in lines[1] and "b.py built" in lines[1]
    assert "0/4 units (+1 already in the store)" in lines[2] and "on the CPU" in lines[2]
    assert "4/4 units" in lines[3] and "done in 10 s on the CPU" in lines[3]
    assert "level1/4/s0 [verified] incorrect" in lines[3]
    assert not any("GPU" in line for line in lines)


def test_nothing_is_written_before_the_first_phase_so_an_input_error_stays_one_line():
    reporter, stream = plain(FakeClock())
    reporter.close()
    assert stream.getvalue() == ""
    clock = FakeClock()
    reporter, stream = plain(clock, heartbeat_s=20)
    reporter(Progress(0, 24, phase="start", device="cpu"))  # then the store refuses the run
    reporter.close()
    assert stream.getvalue() == ""


def test_a_slow_start_is_said_by_the_heartbeat():
    stream = io.StringIO()
    with Reporter(stream, live=False, heartbeat_s=0.3) as reporter:
        reporter(Progress(0, 24, phase="start", device="cuda:0", workers=2))
        time.sleep(1.0)
    assert stream.getvalue().splitlines()[0].endswith("start: 24 units planned on 2 GPUs")


def test_the_estimate_names_the_device_and_counts_down():
    clock = FakeClock()
    reporter, stream = plain(clock)
    reporter(Progress(0, 10, phase="evaluate", device="cuda:0", workers=2))
    reporter(Progress(4, 10, eta_s=120.0, last="x [verified] passed", device="cuda:0", workers=2))
    clock.now += 30
    reporter._write(clock.now)  # what the heartbeat writes
    line = stream.getvalue().splitlines()[-1]
    assert "4/10 units" in line and "about 1 min 30 s left on 2 GPUs" in line and "/min" in line
    clock.now += 200
    reporter._write(clock.now)
    assert "running past the estimate" in stream.getvalue().splitlines()[-1]
    reporter.close()
    assert where(Progress(0, 1, device="cpu")) == "the CPU" and where(Progress(0, 1, device="cuda:1")) == "1 GPU"
    assert where(Progress(0, 1, phase="build", device="cuda:0", workers=4)) == "4 CPU cores"


def test_no_estimate_until_every_protocol_still_pending_has_enough_finished_units():
    """A KernelBench unit takes a fraction of a verified one: guessing one from the other made the estimate jump
    from 2 s to 258 s; and the first few units of a kind are no guide to the rest."""
    five = [2.0] * MIN_FINISHED
    assert estimate_left_s({"original": five}, {"original": 5, "verified": 6}, 1) is None
    assert estimate_left_s({"original": five, "verified": [40.0] * (MIN_FINISHED - 1)},
                           {"original": 5, "verified": 6}, 1) is None
    assert estimate_left_s({"original": five, "verified": [40.0, 44.0] * MIN_FINISHED},
                           {"original": 5, "verified": 6}, 2) == pytest.approx((5 * 2.0 + 6 * 42.0) / 2)
    assert estimate_left_s({"original": five}, {"original": 3, "verified": 0}, 1) == pytest.approx(6.0)
    # the mean: a slow unit among fast ones is part of the time left, not an outlier to drop
    assert estimate_left_s({"verified": [80.0, 5.0, 6.0, 5.0, 4.0]}, {"verified": 10}, 1) == pytest.approx(200.0)


def test_the_estimate_counts_the_parallelism_the_run_really_had():
    """Sixteen threads sharing one GPU: 10 units finished in 100 s of wall time leave 10 more at least 100 s,
    whatever the units' own durations divided by sixteen say."""
    durations = {"verified": [20.0] * 10}
    assert estimate_left_s(durations, {"verified": 10}, 16) == pytest.approx(12.5)
    assert estimate_left_s(durations, {"verified": 10}, 16, elapsed_s=100.0) == pytest.approx(100.0)
    assert estimate_left_s(durations, {"verified": 10}, 1, elapsed_s=100.0) == pytest.approx(200.0)


def _replayed(store: str, workers: int) -> list[tuple[int, float | None, float]]:
    """(units finished, the estimate then, the seconds that were really left) at each unit of a recorded GPU run,
    from its store: each verdict's elapsed_s and the time it was written."""
    import json
    import sqlite3
    import tempfile

    import gpu_stores

    with tempfile.TemporaryDirectory() as folder:
        database = gpu_stores.copy_store(store, Path(folder) / "store.sqlite")
        with contextlib.closing(sqlite3.connect(database)) as db:
            rows = [(written, json.loads(record)["elapsed_s"])
                    for written, record in db.execute("SELECT written, record FROM verdicts ORDER BY written")]
    started, ended = rows[0][0] - rows[0][1], rows[-1][0]
    replay = []
    for done in range(1, len(rows)):
        durations = {"verified": [elapsed for _, elapsed in rows[:done]]}
        estimate = estimate_left_s(durations, {"verified": len(rows) - done}, workers,
                                   elapsed_s=rows[done - 1][0] - started)
        replay.append((done, estimate, ended - rows[done - 1][0]))
    return replay


def test_the_estimate_on_recorded_runs_is_never_a_tenth_of_the_time_left():
    """Two H200 rescores of 40 anchor units. With the median over the workers, the shared one (4 slots, 16 threads)
    said 9 s left where 269 s were (16 of 40 done), and its first estimate was 27 s of 309 s."""
    shared = _replayed("h200-2026-12-03/call3/anchor_store_f_share4.sqlite", workers=16)
    alone = _replayed("h200-2026-12-02/call4_anchor_store_e.sqlite", workers=1)
    for replay in (shared, alone):
        assert all(estimate is None for done, estimate, _ in replay if done < MIN_FINISHED)
        said = [(estimate, left) for _, estimate, left in replay if estimate is not None and left > 10]
        assert said and min(estimate / left for estimate, left in said) > 0.2
    at_16 = next(estimate for done, estimate, _ in shared if done == 16)
    assert at_16 > 60  # 269 s were left



def test_the_heartbeat_writes_while_nothing_finishes():
    stream = io.StringIO()
    with Reporter(stream, live=False, heartbeat_s=0.4) as reporter:
        reporter(Progress(0, 1, phase="build", device="cpu", workers=1))
        time.sleep(1.5)
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 3 and all("build 0/1" in line for line in lines[:-1])


def test_a_terminal_gets_a_live_bar():
    stream = io.StringIO()
    with Reporter(stream, live=True) as reporter:
        reporter(Progress(0, 3, phase="start", device="cpu"))
        reporter(Progress(0, 3, phase="evaluate", device="cpu"))
        for done in range(1, 4):
            reporter(Progress(done, 3, eta_s=3.0 - done, last=f"level1/{done}/s0 [verified] passed"))
    text = stream.getvalue()
    assert "evaluate units" in text and "3/3" in text and "[verified]" in text  # the brackets are not markup
    assert "start units planned" not in text.rsplit("\r", 1)[-1]  # the placeholder row is gone at the end
    assert HEARTBEAT_S < LOG_GAP_LIMIT_S


def test_the_audit_reports_through_the_same_events():
    from types import SimpleNamespace

    from kbverify.cli import jobs

    events: list[Progress] = []
    update = jobs._audit_progress(events.append, 2, "cuda:0")
    update(1, 2, SimpleNamespace(task="level2/80_Gemm", degenerate=True, flags=["constant_output"], error=None))
    assert events[0] == Progress(0, 2, phase="audit", device="cuda:0")
    assert (events[1].done, events[1].total, events[1].phase) == (1, 2, "audit")
    assert events[1].last == "level2/80_Gemm: DEGENERATE constant_output" and events[1].eta_s >= 0
    assert jobs._audit_progress(None, 2, "cpu") is None


# --- a real rescore, piped ----------------------------------------------------------------------------------------

def _lines_with_times(command: list[str], env: dict, timeout_s: float) -> tuple[list[tuple[float, str]], str, int]:
    """stderr's lines with the second each arrived at (from the start), stdout, and the exit code."""
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    arrived: list[tuple[float, str]] = []
    stdout: list[str] = []

    def stamp() -> None:
        for line in process.stderr:
            arrived.append((time.monotonic() - started, line.rstrip("\n")))

    readers = [threading.Thread(target=stamp, daemon=True),
               threading.Thread(target=lambda: stdout.extend(process.stdout), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        code = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    for reader in readers:
        reader.join(timeout=10)
    arrived.append((time.monotonic() - started, "<exit>"))
    return arrived, "".join(stdout), code


@pytest.mark.slow
def test_a_piped_rescore_of_the_bundled_example_logs_a_line_at_least_every_30_s(tmp_path):
    protocol = tmp_path / "verified.json"  # the demo's short timing budget
    protocol.write_text(json.dumps({"base": "verified", "name": "verified", "timing_budget_s": 0.4,
                                    "as_user_set": False}))
    # A fresh build cache, so the native builds really run (a phase that once printed nothing for nine minutes).
    env = {**os.environ, "KBVERIFY_CACHE": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "kbverify", "rescore", "examples/published_run", "--tasks", "tasks/basic",
               "--store", str(tmp_path / "store.sqlite"), "--protocol", f"original,{protocol}", "--device", "cpu",
               "--limit", "4", "--timeout", "300"]
    arrived, stdout, code = _lines_with_times(command, env, timeout_s=900)
    assert code == 0, "\n".join(line for _, line in arrived)[-3000:]
    progress = [(at, line) for at, line in arrived if line.startswith("kbverify ")]
    times = [0.0] + [at for at, _ in progress] + [arrived[-1][0]]
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    assert max(gaps) <= LOG_GAP_LIMIT_S, (gaps, [line for _, line in progress])
    text = [line for _, line in progress]
    assert any(" build 0/2 native builds" in line for line in text)  # the two ReLU samples build C++
    assert any(" build 2/2 native builds" in line and "done in" in line for line in text)
    assert any(" evaluate 0/8 units" in line for line in text)
    assert " evaluate 8/8 units" in text[-1] and "done in" in text[-1]
    assert all("CPU" in line and "GPU" not in line for line in text)
    assert "| fast_1 |" in stdout and "8 units (0 already in" in stdout
