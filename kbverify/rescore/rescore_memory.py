"""Memory admission for units sharing a GPU (`rescore --share-gpu N`), by the audit's mechanism.

The lease (`kbverify.harness.device_share`) counts slots; this counts bytes. Each unit's correctness phase reserves its
expected need in the audit's ledger (`kbverify.audit.admission.MemoryLedger`, one per device) before it takes a
shared slot, and gives it back when the phase ends. The need is, as in the audit (`audit_need_bytes`), a recorded
peak where there is one, else the task's tensors measured on the meta device (`kbverify.audit.footprint`) times a
factor:
- the recorded peak is the reference's forward peak (`ref_peak_memory_bytes` of the timing record, kept in the
  store with every timed verdict of the task on this GPU model);
- a unit's correctness phase runs two processes that each hold a reference-sized working set (the candidate's
  worker and the judge's), and the check of the timed outputs, which runs in that shared phase too, holds copies
  of the timed outputs beside the reference's: hence PAIR_FACTOR over the reference's peak. The timing phase
  itself runs alone (the exclusive lease), so it never meets another unit's memory.
The budget is the audit's: MEMORY_BUDGET_FRACTION of the device's memory; the rest is held back for every
process's CUDA context, the MPS daemon and the allocator's slack. A unit whose need is unknown or alone exceeds
the budget, or that has waited DEFER_S for room, runs its correctness under the exclusive lease: nothing else is on
the device then, and the lease's drains keep it from starving behind a stream of small units. A unit that still
runs out of memory is evaluated again alone before any verdict (`rescore.LocalExecutor._evaluate_once_more_alone`).

Parent side: nvidia-smi for the device's memory, sandboxed children for the meta-device footprints; never torch.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kbverify.audit.admission import MemoryLedger
from kbverify.audit.footprint import AUDIT_MEMORY_FACTOR, Footprint, audit_need_bytes
from kbverify.audit.memory import MEMORY_BUDGET_FRACTION
from kbverify.harness.device_share import DEFER_S

log = logging.getLogger(__name__)

# A unit's shared phase over the reference's recorded forward peak: the candidate's worker and the judge each run a
# reference-sized forward, and the judge holds both outputs and the timed outputs' copies beside them. Not yet
# measured on a GPU (owed: the peaks of a --share-gpu run against these needs).
PAIR_FACTOR = 3.0
# Without a recorded peak, the meta-device tensors (inputs + parameters + outputs) times the audit's factor: its
# worker holds several copies of them, as the pair does here.
FOOTPRINT_FACTOR = AUDIT_MEMORY_FACTOR
WAIT_STEP_S = 0.5  # how often a unit waiting for room asks the ledger again (the audit's DEFERRED_WAIT_S)


def recorded_reference_peaks(verdicts: Iterable, gpu_model: str | None) -> dict[str, int]:
    """Task key -> its reference's forward peak (bytes), from stored verdicts timed on `gpu_model` (any when it is
    unknown); the latest verdict of a task wins, as in the audit's peaks file."""
    peaks: dict[str, int] = {}
    for verdict in verdicts:
        timing = verdict.timing or {}
        # the isolated protocols keep it in the timing worker's record, the others at the top
        peak = timing.get("ref_peak_memory_bytes") or (timing.get("interleaved") or {}).get("ref_peak_memory_bytes")
        model = (verdict.provenance or {}).get("gpu_model")
        if isinstance(peak, int) and not isinstance(peak, bool) and peak > 0 and (
                gpu_model is None or model in (None, gpu_model)):
            peaks[verdict.task] = peak
    return peaks


def unit_need_bytes(reference_peak: int | None, footprint: Footprint | None) -> int | None:
    """A unit's expected need in its shared phase; None: unknown (it runs that phase alone)."""
    if reference_peak:
        return audit_need_bytes(None, recorded_peak_bytes=int(reference_peak * PAIR_FACTOR))
    return audit_need_bytes(footprint, FOOTPRINT_FACTOR)


def device_budget_bytes(device: str) -> int | None:
    """MEMORY_BUDGET_FRACTION of a GPU's memory, from nvidia-smi; None where it cannot be read (no admission)."""
    if not device.startswith("cuda"):
        return None
    index = device.split(":", 1)[1] if ":" in device else "0"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i",
                              index], capture_output=True, text=True, timeout=30, check=True).stdout
        return int(float(out.strip().splitlines()[0]) * 2**20 * MEMORY_BUDGET_FRACTION)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as error:
        log.warning("%s: its memory could not be read (%s); units share it by slots alone", device, error)
        return None


@dataclass(frozen=True)
class Admission:
    """One unit's admission on its device: the device's ledger, the unit's key and its expected need."""

    ledger: MemoryLedger
    key: str
    need_bytes: int | None
    defer_s: float = DEFER_S

    def alone_at_once(self) -> bool:
        """The audit's rule: a need that is unknown, or alone over the budget, has the device to itself."""
        return self.need_bytes is None or self.need_bytes >= self.ledger.budget_bytes

    @contextlib.contextmanager
    def shared(self, lease, holder: str = "") -> Iterator[None]:
        """The unit's shared phase: reserved in the ledger and in a shared slot, or alone on the device."""
        if self.alone_at_once() or not self._reserve():
            log.info("%s: %s of device memory %s; its correctness runs alone", holder or self.key,
                     _gib(self.need_bytes), "does not fit yet" if not self.alone_at_once() else "needed")
            with lease.exclusive(holder):
                yield
            return
        try:
            with lease.shared(holder):
                yield
        finally:
            self.ledger.release(self.key)

    def _reserve(self) -> bool:
        """Whether the need was reserved within defer_s."""
        deadline = time.monotonic() + self.defer_s
        while not self.ledger.try_reserve(self.key, self.need_bytes):
            if time.monotonic() >= deadline:
                return False
            time.sleep(WAIT_STEP_S)
        return True


def _gib(size: int | None) -> str:
    return "an unknown amount" if size is None else f"{size / 2**30:.1f} GiB"


def ledger_for(folder: Path, device: str, budget_bytes: int | None) -> MemoryLedger | None:
    """The ledger of one device's units, in the run's folder; None without a budget."""
    if not budget_bytes:
        return None
    return MemoryLedger(folder / f"memory-{device.replace(':', '')}", budget_bytes)


def unit_needs(units, verdicts: Iterable, gpu_model: str | None) -> dict[str, int | None]:
    """Unit key -> its expected need: from the store's recorded reference peaks, else from the meta-device footprint
    of its task (measured now, in sandboxed children, for the tasks without a peak)."""
    from kbverify.audit.footprint import estimate_footprints

    peaks = recorded_reference_peaks(verdicts, gpu_model)
    tasks = {u.entry.task.key: u.entry.task for u in units if u.entry.task is not None}
    missing = [task for key, task in tasks.items() if key not in peaks]
    footprints = estimate_footprints(missing).by_key if missing else {}
    needs = {u.key: unit_need_bytes(peaks.get(u.entry.task.key), footprints.get(u.entry.task.key))
             if u.entry.task is not None else None for u in units}
    log.info("memory admission: %d of %d tasks from recorded reference peaks, %d from meta-device footprints, "
             "%d unknown (alone)", len(tasks) - len(missing), len(tasks), len(missing),
             sum(1 for need in needs.values() if need is None))
    return needs
