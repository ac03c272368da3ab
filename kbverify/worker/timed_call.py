"""One timed call of either side, in the timing worker: the device-side hold, the L2 flush, the events.

Two kinds of call (SPEC §5, two clocks): `device`, behind a device-side hold that hides the host's launch
overhead (nvbench's blocking kernel), and `host`, without it, each call synchronised (nvbench's sync mode): what
a caller waiting on every call sees. The parent chooses each batch's kind (kbverify.timing.timing_control).
"""

from __future__ import annotations

import gc
import time

import torch

from kbverify.core.inputs import derive_seed
from kbverify.judge.correctness import flatten_outputs
from kbverify.worker import guards
from kbverify.worker.worker import set_seed

EVENT_FLOOR_MS = 0.0005
# Captured when the worker loads, before any submission: a submission that emptied it would time its rival's
# launches.
_SLEEP = getattr(torch.cuda, "_sleep", None)


def flush_buffer(device):
    if device.type != "cuda":
        return None
    l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20) or (50 << 20)
    return torch.empty(max(2 * l2_bytes, 64 << 20) // 4, dtype=torch.float32, device=device)


class Cover:
    """A device-side wait enqueued before each call's inputs, flush and launches.

    Its length is set once, from the warm-up, the same for both sides. Warm-up calls get the longest hold
    (CAP_MS), and those whose host work ended before it ran out show the host's own time per call; the hold is
    then a margin over the slowest of them. A forward that waits on the device (a synchronise, an `.item()`)
    always outlasts its hold, whatever its length, so such calls say nothing about the host and the hold stays at
    its floor for them: a hold that grew to fit them would only grow with them, to the cap. Beyond the hold the
    host's excess shows in the time, for either side, and is counted (`uncovered_calls`).
    """

    FLOOR_MS = 0.05
    CAP_MS = 20.0
    # Warm-up rounds alternate between the cap and this: a forward that waits on the device inside its call has
    # host time that follows the hold whatever its length; one whose host work is merely long does not
    # (kbverify.timing.timing_modes reads the pairs).
    PROBE_SHORT_MS = 5.0
    MARGIN = 1.5
    ENDED_BEFORE = 0.8  # of its hold: a warm-up call that ended before this had host work of its own to show
    FIRST_CALLS = 2  # the warm-up's first call on each side

    def __init__(self, device):
        self.device = device
        self.probing = True  # warm-up: every hold at a probe length
        self.probe_ms = self.CAP_MS
        self.host_ms: list[float] = []  # warm-up calls that ended before their hold: the host's own time
        self.fixed_ms = self.CAP_MS
        self.cycles_per_ms = self._calibrate()

    def _calibrate(self) -> float:
        cycles = 1_000_000
        rates = []
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            _SLEEP(cycles)
            end.record()
            end.synchronize()
            rates.append(cycles / max(start.elapsed_time(end), 1e-3))
        return max(rates[1:])  # the fastest clock seen: the hold is at least as long as asked

    @property
    def length_ms(self) -> float:
        return self.probe_ms if self.probing else self.fixed_ms

    def hold(self) -> None:
        _SLEEP(int(self.length_ms * self.cycles_per_ms))

    def observe(self, host_ms: float) -> int:
        """A call's host time; 1 when it outlasted the hold it had, else 0. Only a warm-up call that ended well
        before its hold (ENDED_BEFORE of it) tells the host's own time: a forward that waits on the device ends
        with its hold, and the hold runs a little short of its nominal length when the clock runs faster than
        calibrated, so on the H200 such calls read 19.9 ms against a 20 ms hold and fixed every later hold at
        the cap: 20 ms a device-kind call, five rounds in a second's budget."""
        outlasted = int(host_ms > self.length_ms)
        if self.probing and host_ms < self.ENDED_BEFORE * self.length_ms:
            self.host_ms.append(host_ms)
        return outlasted

    def settle(self) -> None:
        """After the warm-up: the clock calibrated again on a warm device (a clock still ramping up at the first
        calibration makes every hold short), and the hold's length fixed."""
        self.cycles_per_ms = max(self.cycles_per_ms, self._calibrate())
        self.fix_length()

    def fix_length(self) -> None:
        # Each side's first call pays one-time costs (allocations, library handles, kernel loading) that later
        # calls do not: on the H200 it set a 1 ms hold for calls whose host work took 0.3 ms, and the hold is
        # most of a small call's wall time. Later outliers still count.
        settled = self.host_ms[self.FIRST_CALLS:] or self.host_ms
        slowest = max(settled, default=0.0)
        self.fixed_ms = min(max(self.MARGIN * slowest, self.FLOOR_MS), self.CAP_MS)
        self.probing = False


KINDS = ("device", "host")


def _timed_call(side, draw, device, flush, before_call=None, cover=None, kind: str = "device"):
    """One call: flush, events around the call, a copy of its outputs stream-ordered after it, then a device sync.
    `draw()` makes the call's (seed, inputs); returns (elapsed ms, seed, inputs, flattened outputs, the copy).

    Every call starts from an idle device. In the `device` kind the stream is then held by a device-side wait
    (`cover`) long enough for the host to draw the inputs, enqueue the flush and launch the whole call behind it,
    so the events time the device's work and not the host's launch overhead. Without the hold the first launch
    raced the flush: a sub-0.1 ms call measured 5–30 µs of host time or none, depending on what the host had done
    just before, and an A/A measured on the H200 came out 3–13% off. The inputs are drawn before the hold (a draw
    made on the host may block on the stream) and copied into the call's own tensors behind it: a kernel that
    skips the stream order and starts on another stream at once reads the previous call's values (aliased
    inputs, subclasses and strided slices are the exceptions: they go to the call as drawn).

    The `host` kind has no hold: the copies and the flush are waited for, then the events time the call from an
    idle device, launches and waits inside it included (nvbench's sync mode): what a waiting caller sees.

    Between the inputs' existence and the start event the harness does nothing a submission could hook: the
    thread and mode counts come first. The garbage collector, whose callbacks a submission may register (to run
    inside the reference's timed call, say), is off from the draw until the call is over, for both sides, as
    `timeit` does."""
    mark = time.perf_counter_ns()
    held = cover if kind == "device" else None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if before_call is not None:
        before_call()
    threads = guards.thread_count()
    modes = guards.mode_depths()
    collecting = gc.isenabled()
    gc.disable()
    try:
        mark = side.spent("idle", mark)
        seed, staged = draw()
        host_started = mark = side.spent("draw", mark)
        if held is not None:
            held.hold()
        inputs = side.place(staged)  # `staged` stays referenced until this function returns
        set_seed(derive_seed(side.secret, "rng", len(side.calls)))
        if flush is not None:
            flush.zero_()
        if device.type == "cuda" and held is None:
            torch.cuda.synchronize(device)
            mark = host_started = side.spent("host_kind_sync", mark)
        with torch.set_grad_enabled(side.grad):
            if device.type == "cuda":
                elapsed, flat, early = _on_the_device(side, inputs, device, held, mark, host_started)
            else:
                started = time.perf_counter_ns()
                flat = flatten_outputs(side.model(*inputs))
                elapsed = (time.perf_counter_ns() - started) / 1e6
                early = side.copy_outputs(flat)
                side.spent("run_and_project", mark)
    finally:
        _restore_gc(collecting)
    side.threads_started = max(side.threads_started, guards.thread_count() - threads)
    side.modes_left.update(guards.modes_left_active(modes))
    # the flattened outputs, a plain list, from here on: iterating the returned object again would run the
    # submission's code again, outside the timed region
    return max(elapsed, EVENT_FLOOR_MS), seed, inputs, list(flat), early


def _on_the_device(side, inputs, device, held, mark: int, host_started: int):
    """The events around the call, the copy of its outputs stream-ordered after it, then a device-wide synchronise.
    With a hold: how long the host took to get the call launched (what the hold has to cover)."""
    start, end, projecting, projected, after_sync = (torch.cuda.Event(enable_timing=True) for _ in range(5))
    start.record()
    out = side.model(*inputs)
    # inside the timed region: a returned container's own __iter__ is the submission's code, and whatever it
    # launches or computes is part of the call
    flat = flatten_outputs(out)
    end.record()
    if held is None:
        # Host kind: the harness's work after the call waits for the call's own work first, for both sides. A
        # forward that returns before its kernels end would otherwise have that work (copying the outputs)
        # done while the device still computes, and one that waits for them (a synchronise, an `.item()`) after:
        # on an H100 a blocked side's batches left 0.06 ms a call more of the parent's clock unexplained, and
        # its honest times went unconfirmed (the net wall read a 2x kernel 0.87x).
        end.synchronize()
    # Enqueued before the harness's bookkeeping: the settle gap times the device's work after the end event, and
    # after a blocked call the device is idle, so the host's own latency up to here counted as work left running
    # (0.051 ms against the reference's 0.027 on an H100: an honest kernel read exploit:unsynchronized).
    projecting.record()
    mark = side.spent("launch", mark)
    if held is not None:
        host_ms = (mark - host_started) / 1e6
        side.host_ms.append(host_ms)
        side.uncovered += held.observe(host_ms)
        if held.probing:
            side.probe.append([held.length_ms, host_ms])
    early = side.copy_outputs(flat)
    projected.record()
    torch.cuda.synchronize(device)
    after_sync.record()
    after_sync.synchronize()
    side.spent("run_and_project", mark)
    if held is not None:
        # the device's time after the end event, less the copy's own kernels and launches (the host kind
        # has no hold to launch behind, so its gaps hold the host's own latency and are not compared)
        side.settle_gaps_ms.append(end.elapsed_time(projecting) + projected.elapsed_time(after_sync))
    return start.elapsed_time(end), flat, early


def _restore_gc(collecting: bool) -> None:
    if collecting:
        gc.enable()
