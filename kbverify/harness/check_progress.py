"""Progress of `check`, in the events every long command reports (kbverify.core.progress): a line when a verdict
starts, at each step of it not seen before in it (a worker starting, a kind of phase it announces: a build, the
reference's timing, the correctness trials, the timed calls), when it ends, and the reporter's heartbeat while a
step runs.

The sandbox tells the watcher of the current context (`watching`) when a child starts and when it announces a phase.
A phase after a submission's first one is the submission's word: only its kind is shown, in a safe alphabet and cut
short, so a submission cannot write into the user's terminal through it.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import time
from collections import defaultdict
from typing import Callable, Iterator

from kbverify.core.progress import Progress, estimate_left_s

_WATCHER: contextvars.ContextVar = contextvars.ContextVar("kbverify_check_watcher", default=None)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:+/-]")


def child_started(job: str) -> None:
    """Called by kbverify.harness.sandbox when a child of `job` starts."""
    watcher = _WATCHER.get()
    if watcher is not None:
        watcher.step(job, "")


def child_phase(job: str, phase: str) -> None:
    """Called by kbverify.harness.sandbox when a child of `job` announces `phase`."""
    watcher = _WATCHER.get()
    if watcher is not None:
        watcher.step(job, phase)


def phase_kind(phase: str) -> str:
    """`candidate:correctness:3` → `candidate:correctness`; `judge:original/x1/default/s0` → `judge:original`; in
    a safe alphabet, at most 40 characters."""
    kind = ":".join(phase.split(":")[:2]).split("/")[0]
    return _UNSAFE.sub("?", kind)[:40]


class CheckWatcher:
    """Turns a check's verdicts and the steps the sandbox reports into Progress events for `report` (a Reporter).
    One verdict at a time, in the thread that runs it (the sandbox's calls come from that thread)."""

    def __init__(self, report: Callable[[Progress], None], *, total: int, device: str,
                 clock: Callable[[], float] = time.monotonic):
        self.report, self.total, self.device, self.clock = report, total, device, clock
        self.created = clock()
        self.done = 0
        self.unit = ""
        self.protocol = ""
        self.started_at: float | None = None
        self.shown: set = set()  # the verdict's steps that had a line
        self.last = ""
        self.durations: dict[str, list[float]] = defaultdict(list)
        self.pending: dict[str, int] = defaultdict(int)

    def plan(self, protocols: list[str], submissions: int) -> None:
        for name in protocols:
            self.pending[name] += submissions

    @contextlib.contextmanager
    def verdict(self, submission: str, protocol: str) -> Iterator[None]:
        """Around one verdict: its start, its steps (the sandbox's calls within), its end."""
        self.unit, self.protocol, self.started_at = f"{submission} [{protocol}]", protocol, self.clock()
        self.shown = set()
        token = _WATCHER.set(self)
        try:
            self.step("starting", "")
            yield
        finally:
            _WATCHER.reset(token)
            self.unit = ""
        self.durations[protocol].append(self.clock() - self.started_at)
        self.pending[protocol] = max(0, self.pending[protocol] - 1)
        self.done += 1

    def finished(self, status: str) -> None:
        """What the verdict just ended with, shown as the line's `last`."""
        self.last = f"{self.unit} {status}"

    def preparing(self, what: str) -> None:
        """A line before the first verdict: what the check does first (the device's probe takes seconds), so a log
        shows at once that it started."""
        self.report(self.event(what))

    def step(self, job: str, phase: str) -> None:
        kind = phase_kind(phase) if phase else ""
        step = (job, kind)
        if not self.unit or step in self.shown:  # a step seen again (the judge's sets, one by one) is not news
            return
        self.shown.add(step)
        self.report(self.event(f"{self.unit} {job}" + (f": {kind}" if kind else "")))

    def event(self, step: str = "") -> Progress:
        return Progress(self.done, self.total, eta_s=estimate_left_s(self.durations, self.pending, 1,
                                                                     elapsed_s=self.clock() - self.created),
                        last=self.last, phase="check", device=self.device, step=step)


@contextlib.contextmanager
def watching(report: Callable[[Progress], None] | None, *, total: int, device: str) -> Iterator[CheckWatcher]:
    """A watcher for a check of `total` verdicts; its final event (every verdict done) is reported on leaving, unless
    the check failed (its error is then the last line)."""
    watcher = CheckWatcher(report or (lambda event: None), total=total, device=device)
    yield watcher
    if watcher.done:
        watcher.report(watcher.event())
