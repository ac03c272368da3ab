"""Progress of long work (`check`, `rescore`, `demo`, `audit`), shown to whoever watches it.

The library reports `Progress` events to a callable it is given and never prints; the command line creates the one
`Reporter` that shows them on stderr. In a terminal that is a live bar (rich). Anywhere else (stderr piped, a CI
log) it is a plain line at every phase change (builds included) and at least every `HEARTBEAT_S` seconds while a
phase runs, each with the counts, the rate and an estimate of the time left that names where the work runs. A
phase that names its step (`check`: the worker and the kind of phase it runs) gets a line at each new step too.
"""

from __future__ import annotations

import math
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence, TextIO

from kbverify.core.present import shorten

# Below the 30 s a log reader may wait: the longest gap between two lines, which the heartbeat keeps by writing
# TICK_MARGIN_S early (a loaded machine's scheduling).
HEARTBEAT_S = 20.0
TICK_MARGIN_S = 0.5
_NOUNS = {"start": "units planned", "build": "native builds", "evaluate": "units", "audit": "tasks",
          "check": "verdicts"}


@dataclass(frozen=True)
class Progress:
    """One event of a long job: a phase started (done 0) or one more item of it finished."""

    done: int
    total: int
    skipped: int = 0  # items already done by an earlier run (units found in the store), not in `total`
    eta_s: float | None = None  # wall seconds left, as the job estimates them; None: no estimate yet
    last: str = ""  # what just finished, e.g. "level1/4/s0 [verified] incorrect"
    phase: str = "evaluate"  # "start" (rescore: units planned) | "build" | "evaluate" | "audit"
    device: str = "cpu"  # where the phase's work runs: "cpu", "cuda:0"; builds run on CPU cores
    workers: int = 1  # how many items run side by side (devices, build processes, evaluating threads)
    devices: int | None = None  # how many devices the items run on; None: one per worker
    step: str = ""  # what the phase does now (`check`); a new step is a line of its own


# Finished items of a kind before its time is guessed. The recorded runs replayed (tests/test_progress.py) read
# 5-30x short after one or two units: a run's first units are not its slowest (a source lists level 3 last).
MIN_FINISHED = 5


def estimate_left_s(durations: Mapping[str, Sequence[float]], pending: Mapping[str, int], workers: int, *,
                    elapsed_s: float | None = None) -> float | None:
    """Wall seconds left, the longer of two readings: every pending item at the mean duration of the finished
    items of its kind (for `rescore`, its protocol), spread over `workers`; and, given the phase's `elapsed_s`, the
    pending items at the wall time each finished one has cost so far, which counts the parallelism the run really
    had (sixteen threads on one shared GPU do not go sixteen times as fast). None until each kind still pending has
    MIN_FINISHED finished items: guessing a `verified` unit from a KernelBench one, ten times shorter, is how an
    estimate jumps from 2 s to 258 s, and a median of the first few said 9 s where 269 s were left. The mean, not
    the median: the slow items are the time left, and a median hides them."""
    total, left, finished = 0.0, 0, 0
    for kind, count in pending.items():
        seen = durations.get(kind) or ()
        finished += len(seen)
        if count <= 0:
            continue
        if len(seen) < MIN_FINISHED:
            return None
        total += count * statistics.fmean(seen)
        left += count
    by_items = total / max(1, workers)
    if elapsed_s is None or not finished:
        return by_items
    return max(by_items, left * elapsed_s / finished)


def where(event: Progress) -> str:
    """Where a phase's work runs, in words: 'the CPU', '2 GPUs', '4 CPU cores'."""
    if event.phase == "build":
        return f"{event.workers} CPU core{'s' if event.workers != 1 else ''}"
    if str(event.device).startswith("cuda"):
        gpus = event.devices if event.devices is not None else event.workers
        return f"{gpus} GPU{'s' if gpus != 1 else ''}"
    return "the CPU"


def duration(seconds: float) -> str:
    """'45 s', '3 min 05 s', '1 h 02 min'."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def describe(event: Progress, *, phase_s: float, left_s: float | None, width: int = 70) -> str:
    """One plain line: phase, counts, rate, time left and where, the last item."""
    if event.phase == "start":
        return f"start: {event.total} units planned on {where(event)}"
    noun = _NOUNS.get(event.phase, "items")
    parts = [f"{event.phase} {event.done}/{event.total} {noun}"
             + (f" (+{event.skipped} already in the store)" if event.skipped else "")]
    if event.total and event.done >= event.total:
        parts.append(f"done in {duration(phase_s)} on {where(event)}")
    else:
        if event.done and phase_s > 0:
            parts.append(f"{60 * event.done / phase_s:.1f}/min")
        parts.append(_left_text(left_s, event))
    if event.step:
        parts.append(f"now: {shorten(event.step, width)}")
    if event.last:
        parts.append(f"last: {shorten(event.last, width)}")
    return " · ".join(parts)


def _left_text(left_s: float | None, event: Progress) -> str:
    if left_s is None:
        return f"on {where(event)}, time left: estimating"
    if left_s < 0.5:
        return f"on {where(event)}, running past the estimate"
    return f"about {duration(left_s)} left on {where(event)}"


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Reporter:
    """Shows `Progress` events on `stream` (stderr): a live bar where it is a terminal, plain lines elsewhere.

    Phases may run side by side (a rescore's builds overlap its evaluation): each has its own bar, and in a log
    its own line when it starts and when it finishes, and a heartbeat line while it runs. Call it with each event
    (it is thread-safe), and close it (or use it as a context manager) when the work ends. Nothing is written
    before the first event, so a command that fails on its input prints one line.
    """

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None, heartbeat_s: float = HEARTBEAT_S,
                 clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.live = _is_terminal(self.stream) if live is None else live
        self.heartbeat_s = heartbeat_s
        self.clock = clock
        self._lock = threading.Lock()
        self._started: float | None = None
        self._event: Progress | None = None  # the latest event of any phase
        self._phases: dict[str, _Phase] = {}
        self._last_line_at = 0.0
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._bar = None

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __call__(self, event: Progress) -> None:
        with self._lock:
            now = self.clock()
            if self._started is None:
                self._started = now
                self._start_ticker()
            phase = self._phases.get(event.phase)
            new_phase = phase is None
            if new_phase:
                phase = self._phases[event.phase] = _Phase(started_at=now)
                if event.phase != "start" and not self.live:
                    self._phases.pop("start", None)  # the first real phase says the rest
            phase.event, phase.event_at = event, now
            self._event = event
            if self.live:
                self._show_live(event.phase, new_phase)
            elif new_phase and event.phase == "start":
                # said only if the next phase is slow to come: an input error found meanwhile stays one line
                self._last_line_at = now
            elif new_phase or (_finished(event) and phase.printed is not event) or _new_step(phase.printed, event):
                self._write(now, event.phase)

    def close(self) -> None:
        """The last line of each phase not yet shown (plain) or the bars' last state (live); stops the heartbeat."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        with self._lock:
            if self._event is None:
                return
            if self.live:
                if "start" in self._phases:
                    self._bar.remove_task(self._phases.pop("start").task)
                for name in self._phases:
                    self._show_live(name, False)
                self._bar.stop()
                return
            now = self.clock()
            for name, phase in self._phases.items():
                if name != "start" and phase.printed is not phase.event:
                    self._write(now, name)

    # --- internals ------------------------------------------------------------------------------------------

    def _left_s(self, phase: "_Phase", now: float) -> float | None:
        """The job's estimate, counted down since it was made (below 0 once the work outlasts it)."""
        event = phase.event
        if event.eta_s is None or not math.isfinite(event.eta_s):
            return None
        return event.eta_s - (now - phase.event_at)

    def _line(self, now: float, name: str) -> str:
        phase = self._phases[name]
        return (f"{_clock(now - self._started)}  "
                + describe(phase.event, phase_s=now - phase.started_at, left_s=self._left_s(phase, now)))

    def _write(self, now: float, name: str | None = None) -> None:
        name = name or self._event.phase
        self.stream.write(f"kbverify {self._line(now, name)}\n")
        self.stream.flush()
        self._last_line_at = now
        self._phases[name].printed = self._phases[name].event

    def _start_ticker(self) -> None:
        self._ticker = threading.Thread(target=self._tick, name="kbverify-progress", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        """Live: refresh the estimates every second. Plain: a line per running phase whenever none was written for
        heartbeat_s."""
        wait_s = min(1.0, self.heartbeat_s / 4)
        while not self._stop.wait(wait_s):
            with self._lock:
                wait_s = self.beat()

    def beat(self) -> float:
        """One tick (under the lock): live, refresh the bars; plain, a line per running phase once none was written
        for heartbeat_s (less TICK_MARGIN_S). Returns how long to wait for the next tick."""
        now = self.clock()
        if self.live:
            for name in self._phases:
                self._show_live(name, False)
            return 1.0
        due = self._last_line_at + self.heartbeat_s - min(TICK_MARGIN_S, self.heartbeat_s / 4)
        if now >= due:
            running = [name for name, phase in self._phases.items() if not _finished(phase.event)]
            for name in running or [self._event.phase]:
                self._write(now, name)
            due = now + self.heartbeat_s - min(TICK_MARGIN_S, self.heartbeat_s / 4)
        return max(0.01, min(1.0, due - now))

    def _show_live(self, name: str, new_phase: bool) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

        phase, now = self._phases[name], self.clock()
        event = phase.event
        if self._bar is None:
            self._bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("{task.fields[left]}", markup=False),
                            TextColumn("{task.fields[last]}", markup=False, style="dim"),
                            console=Console(file=self.stream), transient=False)
            self._bar.start()
        if new_phase:
            if name != "start" and "start" in self._phases:
                self._bar.remove_task(self._phases.pop("start").task)  # a placeholder until the first real phase
            noun = _NOUNS.get(name, "items")
            phase.task = self._bar.add_task(f"{name} {noun}", total=max(1, event.total), left="", last="")
        if name == "start":
            text = f"starting on {where(event)}"
        elif _finished(event):
            text = f"done on {where(event)}"
        else:
            text = _left_text(self._left_s(phase, now), event)
        if event.skipped:
            text += f" (+{event.skipped} in the store)"
        # a phase with nothing to do (every unit already in the store) shows as one full bar
        self._bar.update(phase.task, completed=event.done if event.total else 1, total=max(1, event.total),
                         left=text, last=shorten(event.last, 40))


class _Phase:
    """What the reporter knows of one phase: its latest event, when it started, what was last shown of it."""

    def __init__(self, started_at: float):
        self.started_at = started_at
        self.event: Progress | None = None
        self.event_at = started_at
        self.printed: Progress | None = None
        self.task = None  # its bar's row, live


def _new_step(printed: Progress | None, event: Progress) -> bool:
    return bool(event.step) and (printed is None or printed.step != event.step)


def _finished(event: Progress) -> bool:
    return event.phase != "start" and event.done >= event.total


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
