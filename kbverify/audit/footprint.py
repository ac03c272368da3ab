"""How much device memory auditing a task needs, estimated without allocating any (parent side).

The task's model, inputs and forward run on the `meta` device inside sandboxed children, each for a batch of
tasks (`kbverify.worker.footprint_worker`): the parent never executes task code. The audit holds several copies of
those tensors at once (see AUDIT_MEMORY_FACTOR), so the estimate is the measured bytes times that factor.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from kbverify.core.tasks import Task
from kbverify.harness.sandbox import ChildSpec, run_children

log = logging.getLogger(__name__)

# Peak device memory of one audit process over the bytes of one set of (inputs + parameters + outputs).
# The audit worker holds at once: the x1 draw and the distribution's copy of the inputs (2x), the reference's
# output, its family's anchor and the previous seed's output (3x outputs), a null kernel's output, the bf16/fp16
# reference's, the "wide" distribution's mask and float64 comparison chunks, plus the CUDA caching allocator's
# slack. On the H200 (h200-2026-11-29f in results/archive), against inputs + outputs: 39_L2Norm_ (16 GiB) held 30.7 GiB when it asked for
# 8 GiB more (>= 2.4x), 45_Average_Pooling_2D (16.1 GiB) held 42.7 GiB when it asked for 16 GiB more (>= 3.6x).
# 4 covers both while letting two 12-14 GiB tasks (the element-wise and norm tasks of level 1, 23 of them) share
# the GPU; at 5 none of those could, and their audits, one at a time, were a ~500 s chain on their own. Each audit
# records its peak (`peak_memory_bytes`), so the factor is checked on every GPU run; an underestimate costs an
# out-of-memory error and a place in the retry pass, not a wrong verdict. The H200 peaks of h200-2026-11-29g (results/archive) were 2.8-5x the
# tensors on the large tasks (cumprod 9x), most of them in the dead check's backward; that backward now holds
# less (counted on a CPU in input-sized tensors: Softsign 10 -> 7, L2Norm and FrobeniusNorm 9 -> 6, ReLU's peak
# of 5 elsewhere), which leaves room to lower the factor once a GPU run has shown the new peaks.
AUDIT_MEMORY_FACTOR = 4.0
FOOTPRINT_TIMEOUT_S = 300.0
# KernelBench's 250 tasks take ~9 s in one child on a CPU (8 recurrent tasks cut off at 0.5 s each, ~1 s loading
# torch's meta kernels): device time in a ten-minute audit, so a few children share them.
FOOTPRINT_BATCHES = 4


@dataclass(frozen=True)
class Footprint:
    """One task's tensor bytes as measured on `meta`; a byte count the measurement did not reach is None."""

    status: str  # full | no_outputs (the forward failed on meta) | unknown (inputs or model failed)
    input_bytes: int | None = None
    parameter_bytes: int | None = None  # parameters and buffers
    output_bytes: int | None = None
    error: str | None = None  # the first failure on meta, for the log

    def __post_init__(self):
        if self.status not in ("full", "no_outputs", "unknown"):
            raise ValueError(f"unknown footprint status {self.status!r}")

    @property
    def tensor_bytes(self) -> int | None:
        """Inputs + parameters (+ outputs when known); None when even the inputs are unknown."""
        if self.status == "unknown":
            return None
        return (self.input_bytes or 0) + (self.parameter_bytes or 0) + (self.output_bytes or 0)

    @classmethod
    def from_dict(cls, data: dict) -> Footprint:
        return cls(status=data.get("status", "unknown"), input_bytes=data.get("input_bytes"),
                   parameter_bytes=data.get("parameter_bytes"), output_bytes=data.get("output_bytes"),
                   error=data.get("error"))


@dataclass(frozen=True)
class Footprints:
    by_key: dict[str, Footprint]  # Task.key → its footprint
    device_total_bytes: int | None  # the device's total memory, when the child ran on a CUDA device


# A recorded peak is the allocator's reserve in an earlier audit of the same task source on the same kind of GPU.
# The reserve is already above what the task needs: 1.0-1.33x its allocated peak (median 1.17 over the 250
# tasks of h200-2026-11-30 in results/archive), and the allocator frees its cached blocks and retries before it runs out. Two audits (11-29g, 11-30) differed by up
# to 17%, on AlexNet (11 GiB); the big element-wise tasks, which decide how many run at once, were not above their
# earlier reserve. A margin costs the same fraction of every big task's memory-seconds, the audit's bound: replayed
# with the 11-30 audit's walls, 1.2 took 954 s against 796 s at 1.05. What it leaves uncovered, the budget's unreserved
# 15% (about 21 GiB of an H200) absorbs.
PEAK_MARGIN = 1.05


def audit_need_bytes(footprint: Footprint | None, factor: float = AUDIT_MEMORY_FACTOR, *,
                     recorded_peak_bytes: int | None = None) -> int | None:
    """Device bytes an audit of the task is expected to peak at; None when unknown (the caller treats it as
    large). A recorded peak wins over the estimate: the factor is an average over tasks, and the tasks it
    under-reserves (small convolutions with large cuDNN workspaces reached 13x their tensors) ran out of memory."""
    if recorded_peak_bytes:
        return int(recorded_peak_bytes * PEAK_MARGIN)
    measured = None if footprint is None else footprint.tensor_bytes
    return None if measured is None else int(measured * factor)


def recorded_peaks(records) -> dict[str, int]:
    """Task content hash -> the reserve its audit peaked at, from audit records (`raw.peak_memory_bytes`, as the
    audit's partial file holds them); the later of two records of one task wins (it ran the newer code)."""
    peaks: dict[str, int] = {}
    for record in records:
        reserved = ((record.get("raw") or {}).get("peak_memory_bytes") or {}).get("reserved")
        if record.get("sha256") and isinstance(reserved, int) and reserved > 0:
            peaks[record["sha256"]] = reserved
    return peaks


def estimate_footprints(tasks: Sequence[Task], *, device: str = "cpu", batches: int = FOOTPRINT_BATCHES,
                        timeout_s: float = FOOTPRINT_TIMEOUT_S) -> Footprints:
    """Every task's footprint from `batches` children side by side; if one dies (a task crashing the
    interpreter), each task of its batch again in a child of its own, so one bad task leaves only itself unknown.
    With a CUDA `device`, the children also report its total memory."""
    chunks = [list(tasks[i::batches]) for i in range(batches) if tasks[i::batches]]
    by_key: dict[str, Footprint] = {}
    totals = []
    for chunk, outcome in zip(chunks, run_children([_spec(c, device, timeout_s) for c in chunks])):
        result = _result(outcome)
        if result is None:
            log.warning("a footprint child died; measuring its %d tasks one child each", len(chunk))
            singles = [_result(o) for o in run_children([_spec([t], device, timeout_s) for t in chunk])]
            result = {"footprints": {}}
            for task, single in zip(chunk, singles):
                result["footprints"].update((single or {}).get("footprints") or {
                    task.key: {"status": "unknown", "error": "the footprint child died"}})
        by_key.update((key, Footprint.from_dict(data)) for key, data in result["footprints"].items())
        totals.append(result.get("device_total_bytes"))
    return Footprints(by_key=by_key, device_total_bytes=next((t for t in totals if t), None))


def _spec(tasks: Sequence[Task], device: str, timeout_s: float) -> ChildSpec:
    payload = {"device": device, "tasks": [{"key": t.key, "task_source": t.source, "task_name": t.name}
                                           for t in tasks]}
    return ChildSpec("footprint", payload, timeout_s, device)


def _result(outcome) -> dict | None:
    result = outcome.result
    if result is None or "footprints" not in result:
        log.warning("footprint child failed (exit code %s, last phase %s): %s", outcome.exit_code,
                    outcome.last_phase or "start", (result or {}).get("infrastructure_error", "no result"))
        return None
    return result
