"""Sharing one device between units: correctness side by side, timing alone (SPEC §8 Throughput, issue 22).

A unit's correctness phase (candidate and judge processes over the input sets) mostly starts processes, imports
torch, loads the task and compares outputs; its GPU work is short. Its timing phase measures, and anything else on
the device moves the numbers. So each device has a `DeviceLease` over the threads of one process:
- up to `slots` threads hold the shared lease (CORRECTNESS) at once;
- the exclusive lease (TIMING) is granted only when no shared holder is left, and while the lease *drains* for it,
  no new shared holder is let in: a stream of correctness work can never starve timing;
- the lease drains once `batch` timing requests wait, or the oldest has waited `defer_s`, or nothing shared is
  held (a drain then costs nothing), never while correctness held back by the last drain still waits. While it
  drains no correctness enters; its batch (the timing requests waiting when it started, and up to `batch` more
  that ask meanwhile) runs back to back, then the correctness it held back goes first. So each kind waits through
  at most one turn of the other. Each drain leaves slots idle while the longest correctness phase still running
  ends (tens of seconds for a large task), which is why timing is gathered: on the H200, 40 anchor kernels took
  330 s at four slots draining for every timing phase against 341 s at one.
Measured by `bench/bench_lease.py` on the H200 store of 2026-12-03, call 3 (`tests/data/gpu_stores.tar.xz`; that
run's phase times replayed as sleeps, 40 verified + 40 original units, four slots; lower bound 0.48 of one at a
time): draining at once 0.85, 16 threads with batches of 12 (the default) 0.64, 32 threads 0.53. What is left is
the drains that wait for a long correctness phase: the same units sorted longest correctness first read 0.50, but
the executor does not know those times before it runs a unit.
With `slots` = 1 the lease is a mutex (one holder of either kind), which is what one evaluating thread per device
always was. The executor runs more threads than slots (`threads_for`), so that timing requests can gather while
every slot still checks correctness.

Every acquisition has a deadline (`wait_s`): the holders ahead of it are bounded by their own workers' timeouts, so a
wait past it is a bug of ours, raised as LeaseTimeout (an infrastructure error: the unit gets no verdict and a rerun
resumes it) instead of a hang. A lease is released when its block exits, however it exits; a waiter interrupted or
timed out leaves the queue, so nothing is leaked. A thread never nests two leases of one device (it would wait on
itself): that raises at once.

Memory: the lease counts slots, not bytes; `kbverify.rescore.rescore_memory` admits units by bytes, with the audit's
ledger (`kbverify.audit.admission.MemoryLedger`), before a correctness phase takes its slot (`Sharing.admission`).
A unit that still ran out of device memory beside others is evaluated again alone (`ran_out_of_memory`,
`Sharing.alone`), so sharing never turns into a verdict.

Pure: no processes, no torch (the admission's ledger is a file, reached through `Sharing.admission`). The executor
(`kbverify.rescore.rescore.LocalExecutor`) makes one lease per device and hands it to `kbverify.harness.runner.check` inside a
`Sharing`; `phase(sharing, kind, holder)` is what the runner enters.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kbverify.core.errors import InfrastructureError

log = logging.getLogger(__name__)

CORRECTNESS = "correctness"  # the shared lease
TIMING = "timing"  # the exclusive lease
KINDS = (CORRECTNESS, TIMING)
# Longest run of workers one phase starts one after another, each within the workers' timeout (timing: the timing
# worker, the check of its outputs, the clean reference, the reference alone), for the default deadline.
WORKERS_PER_PHASE = 4
# The longest a timing request waits for others to gather before the lease drains for it anyway: a bound on how
# far a unit's timing is put off, well inside any lease deadline (default_wait_s).
DEFER_S = 60.0


class LeaseTimeout(InfrastructureError):
    """A lease not granted within its deadline."""


@dataclass(frozen=True)
class LeaseEvent:
    """One change of a lease, in the order the lease saw them (observers are called under its lock)."""

    device: str
    kind: str  # CORRECTNESS | TIMING
    action: str  # "wait" (asked), "hold" (granted), "release", "timeout"
    holder: str
    at: float  # time.monotonic()
    shared_holders: int  # after the change
    exclusive: bool  # the exclusive lease is held, after the change


class _Request:
    __slots__ = ("kind", "holder", "thread", "asked", "batched", "owed")

    def __init__(self, kind: str, holder: str):
        self.kind, self.holder, self.thread = kind, holder, threading.get_ident()
        self.asked = time.monotonic()
        self.batched = False  # timing: the drain now running serves it
        self.owed = False  # correctness: held back by the last drain, so it goes before the next


class DeviceLease:
    """The shared/exclusive lease of one device (see the module's docstring)."""

    def __init__(self, device: str, slots: int = 1, *, wait_s: float | None = None,
                 observer: Callable[[LeaseEvent], None] | None = None, batch: int = 1, defer_s: float = DEFER_S):
        if slots < 1 or batch < 1:
            raise ValueError("a device lease needs at least one shared slot and a timing batch of at least one")
        self.device, self.slots, self.wait_s, self.observer = device, slots, wait_s, observer
        self.batch, self.defer_s = batch, defer_s
        self._draining, self._joined = False, 0
        self._cond = threading.Condition()
        self._queue: collections.deque[_Request] = collections.deque()
        self._shared: dict[int, str] = {}  # thread id → holder
        self._exclusive: tuple[int, str] | None = None

    @contextlib.contextmanager
    def shared(self, holder: str = "") -> Iterator[None]:
        with self._held(CORRECTNESS, holder):
            yield

    @contextlib.contextmanager
    def exclusive(self, holder: str = "") -> Iterator[None]:
        with self._held(TIMING, holder):
            yield

    def holders(self) -> tuple[int, bool]:
        """(shared holders, exclusive held) now: for logs and tests."""
        with self._cond:
            return len(self._shared), self._exclusive is not None

    @contextlib.contextmanager
    def _held(self, kind: str, holder: str) -> Iterator[None]:
        request = _Request(kind, holder)
        self._acquire(request)
        try:
            yield
        finally:
            self._release(request)

    def _acquire(self, request: _Request) -> None:
        with self._cond:
            self._refuse_nesting(request)
            self._queue.append(request)
            self._join_drain(request)
            self._emit(request, "wait")
            asked = time.monotonic()
            deadline = None if self.wait_s is None else asked + self.wait_s
            try:
                while not self._grantable(request):
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        self._emit(request, "timeout")
                        raise LeaseTimeout(f"{self.device}: the {request.kind} lease for {request.holder or '?'} "
                                           f"was not granted within {self.wait_s:g} s")
                    self._cond.wait(_sooner(left, self._until_deferred()))
            except BaseException:  # a timeout, or an interrupt while waiting: leave the queue, wake who is next
                self._queue.remove(request)
                self._end_drain_if_done()
                self._cond.notify_all()
                raise
            self._queue.remove(request)
            if request.kind == TIMING:
                self._exclusive = (request.thread, request.holder)
            else:
                self._shared[request.thread] = request.holder
            self._end_drain_if_done()
            self._emit(request, "hold")
            self._cond.notify_all()  # the next in line may be a shared request that fits too
        waited = time.monotonic() - asked
        if waited > 1.0:
            log.debug("%s: %s lease for %s after %.1f s", self.device, request.kind, request.holder, waited)

    def _release(self, request: _Request) -> None:
        with self._cond:
            if request.kind == TIMING:
                self._exclusive = None
                self._end_drain_if_done()
            else:
                self._shared.pop(request.thread, None)
            self._emit(request, "release")
            self._cond.notify_all()

    def _grantable(self, request: _Request) -> bool:
        """The first request of its kind, when its kind may go: correctness in a free slot while the lease does not
        drain, timing on a drained device for a request of the drain's batch. While the lease drains no correctness
        enters at all, so the batch's timing phases run back to back: letting in a correctness request that asked
        between two of them left the device to that one phase while the timing behind it waited (bench_lease, 4
        slots, 16 threads: 26 drains and 0.92 of one at a time before, 3 drains and 0.64 now)."""
        if self._exclusive is not None or self._first(request.kind) is not request:
            return False
        self._start_drain_if_due()
        if request.kind == TIMING:
            return self._draining and not self._shared and request.batched
        return not self._draining and len(self._shared) < self.slots

    def _earlier(self, request: _Request, kind: str) -> bool:
        """Whether a request of `kind` asked before `request` and still waits."""
        for waiting in self._queue:
            if waiting is request:
                return False
            if waiting.kind == kind:
                return True
        return False

    def _first(self, kind: str) -> _Request | None:
        return next((r for r in self._queue if r.kind == kind), None)

    def _start_drain_if_due(self) -> None:
        """Drains once `batch` timing requests wait, or the oldest has waited `defer_s`, or no shared holder is left
        and no correctness request asked before the oldest timing one (the drain then costs nothing); never while a
        correctness request held back by the last drain still waits, so correctness waits through one drain at
        most. The drain's batch is every timing request waiting now and up to `batch` more that ask while it runs
        (timing-only units taken meanwhile cost no second drain)."""
        if self._draining:
            return
        timing = [r for r in self._queue if r.kind == TIMING]
        if not timing or any(r.owed for r in self._queue):
            return
        waited = time.monotonic() - timing[0].asked
        if (len(timing) >= self.batch or waited >= self.defer_s
                or (not self._shared and not self._earlier(timing[0], CORRECTNESS))):
            self._draining, self._joined = True, 0
            for waiting in timing:
                waiting.batched = True

    def _join_drain(self, request: _Request) -> None:
        if request.kind == TIMING and self._draining and self._joined < self.batch:
            request.batched, self._joined = True, self._joined + 1

    def _end_drain_if_done(self) -> None:
        """A drain ends when its last timing phase ends (a request asking while that one holds still joins)."""
        if self._draining and self._exclusive is None and not any(r.batched for r in self._queue):
            self._draining = False
            for waiting in self._queue:
                waiting.owed = waiting.kind == CORRECTNESS

    def _until_deferred(self) -> float | None:
        """Seconds until the oldest waiting timing request is due by its wait alone (a waiter wakes then)."""
        if self._draining:
            return None
        oldest = self._first(TIMING)
        return None if oldest is None else max(0.0, oldest.asked + self.defer_s - time.monotonic()) + 1e-3

    def _refuse_nesting(self, request: _Request) -> None:
        thread = request.thread
        if thread in self._shared or (self._exclusive and self._exclusive[0] == thread) or any(
                r.thread == thread for r in self._queue):
            raise RuntimeError(f"{self.device}: {request.holder or 'a thread'} asked for the {request.kind} lease "
                               f"while holding one (a thread would wait on itself)")

    def _emit(self, request: _Request, action: str) -> None:
        if self.observer is not None:
            self.observer(LeaseEvent(self.device, request.kind, action, request.holder, time.monotonic(),
                                     len(self._shared), self._exclusive is not None))


def _sooner(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def threads_for(slots: int) -> int:
    """Evaluating threads for a device with `slots` shared slots. A thread waiting for timing (or for a slot) holds
    no process and no device memory, so threads beyond the slots cost nothing but let timing requests gather
    (`batch_for`) while every slot stays busy. bench_lease at four slots (see the module's docstring): 8 threads
    0.70 of one at a time, 12: 0.68, 16: 0.64, 32: 0.53 (one shuffle of 40 anchors; other shuffles of 16 read
    0.58-0.65). 32 would gather more, but a rerun after an interruption redoes every unit in flight."""
    return slots if slots == 1 else 4 * slots


def batch_for(slots: int) -> int:
    """The timing requests a lease with `slots` slots waits for before it drains (see threads_for)."""
    return 1 if slots == 1 else threads_for(slots) - slots


def default_wait_s(slots: int, worker_timeout_s: float, defer_s: float = DEFER_S) -> float:
    """A deadline no honest wait reaches: everyone ahead (each other thread of the device holds or waits for one
    phase, timing ones one at a time, a timing request put off for `defer_s` at most) finishes a phase of
    WORKERS_PER_PHASE workers within their timeout."""
    return (2 * threads_for(slots) + 1) * WORKERS_PER_PHASE * worker_timeout_s + defer_s


@dataclass(frozen=True)
class Sharing:
    """How a check shares its device: the lease its phases take, the environment its correctness workers get (a
    private MPS daemon's, `kbverify.harness.mps`; empty without one), and what its verdict's provenance says of both."""

    lease: DeviceLease
    correctness_env: tuple[tuple[str, str], ...] = ()
    mps: bool = False
    mps_reason: str = ""
    alone: bool = False  # correctness too under the exclusive lease: a unit again after it ran out of memory
    # The unit's memory admission (`kbverify.rescore.rescore_memory.Admission`): its correctness phase reserves its need
    # before it takes a shared slot. None: slots alone (a CPU, or a device whose memory is unknown).
    admission: object | None = None

    def provenance(self) -> dict:
        return {"slots": self.lease.slots, "mps": self.mps, "mps_reason": self.mps_reason,
                **({"alone": True} if self.alone else {})}


OUT_OF_MEMORY_STATUSES = ("runtime_error", "crashed", "unverifiable", "compile_error", "timeout")


def ran_out_of_memory(status: str, message: str) -> bool:
    """A failure that units sharing a device can cause each other: the device's memory ran out. Such a unit is
    evaluated again alone (`Sharing.alone`), so that what its neighbours held never becomes its verdict."""
    return status in OUT_OF_MEMORY_STATUSES and "out of memory" in message.lower()



def phase(sharing: Sharing | None, kind: str, holder: str = ""):
    """The block of one phase of a check: under the device's lease of `kind`, or as it always ran (no sharing)."""
    if sharing is None:
        return contextlib.nullcontext()
    if kind not in KINDS:
        raise ValueError(f"unknown phase kind {kind!r}")
    if kind == CORRECTNESS and not sharing.alone:
        if sharing.admission is not None:
            return sharing.admission.shared(sharing.lease, holder)
        return sharing.lease.shared(holder)
    return sharing.lease.exclusive(holder)


def visible_devices(device: str) -> str | None:
    """What a child's CUDA_VISIBLE_DEVICES is: exactly one GPU (its cuda:0), named through the parent's own visible
    list; "cuda:all" leaves the list as it is (for probing how many there are); a CPU child sees none."""
    if not device.startswith("cuda"):
        return ""
    _, _, index = device.partition(":")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if index == "all":
        return visible
    physical = visible.split(",") if visible else None
    position = int(index or 0)
    return physical[position] if physical and position < len(physical) else str(position)
