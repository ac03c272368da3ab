"""The original protocol (KernelBench v0.1): its one evaluation record, decided as KernelBench decides it, and the
KernelBench-style timing of `kbv`. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kbverify.core.protocols import Protocol
from kbverify.core.records import BuildRecord
from kbverify.core.status import Status, Warn
from kbverify.judge.build import build_record, code_path_warnings
from kbverify.judge.static import StaticScan


@dataclass(frozen=True)
class KernelbenchDecision:
    """The original (KernelBench v0.1) protocol's verdict from its one evaluation record."""

    status: Status
    message: str
    warnings: tuple[str, ...]
    build: BuildRecord
    timing: dict
    speedup: float | None = None
    ref_time_ms: float | None = None
    cand_time_ms: float | None = None


def kernelbench_timing_error(record: dict) -> tuple[Status, str]:
    """The candidate's KernelBench-style timing worker reported an error instead of a time."""
    return Status.RUNTIME_ERROR, "while timed: " + str(record.get("error", "no time reported"))


def speedup_of(ref_ms: float, cand_ms: float, rules) -> tuple[float, list[str]]:
    """A mean-time speedup, as KernelBench reports it, and the warning an implausible one earns."""
    speedup = ref_ms / cand_ms if cand_ms > 0 else math.inf
    return speedup, [Warn.EXCESSIVE_SPEEDUP.value] if speedup > rules.excessive_speedup else []


def decide_kernelbench(record: dict, static: StaticScan, protocol: Protocol) -> KernelbenchDecision:
    """The original protocol's one evaluation record (its child checks and times in one job). A COMPILE_ERROR
    here may still be found to be the machine's by the runner."""
    build = build_record(static, record.get("extensions"))
    warnings = code_path_warnings(static, build)
    if record.get("namespace_rebind"):
        warnings.append(Warn.NAMESPACE_REBIND.value)
    status, message = kernelbench_status(record)
    timing = {"kernelbench": {key: record.get(key) for key in ("times_ms", "runtime_stats", "runtime_ms",
                                                                "input_shapes", "error_during_performance")},
              "trials": record.get("trials"), "namespace_rebind": record.get("namespace_rebind")}
    speedup = ref_ms = cand_ms = None
    if status is Status.PASSED and record.get("runtime_ms"):
        baseline = record.get("baseline") or {}
        if "runtime_ms" not in baseline:
            status, message = Status.UNVERIFIABLE, "the reference could not be timed: " + baseline.get("error", "")
        else:
            timing["baseline"] = baseline
            ref_ms, cand_ms = baseline["runtime_ms"], record["runtime_ms"]
            speedup, excessive = speedup_of(ref_ms, cand_ms, protocol.rules)
            warnings += excessive
            if baseline.get("input_shapes") != record.get("input_shapes"):
                timing["input_shapes_differ"] = True
    return KernelbenchDecision(status, message, tuple(dict.fromkeys(warnings)), build, timing, speedup, ref_ms,
                               cand_ms)


def kernelbench_status(record: dict) -> tuple[Status, str]:
    if not record.get("compiled"):
        return Status.COMPILE_ERROR, record.get("compilation_error", "")
    if record.get("runtime_error"):
        return Status.RUNTIME_ERROR, record["runtime_error"]
    if record.get("correctness_issue") == "shape_mismatch":
        shape = next((t["shape_mismatch"] for t in record.get("trials", []) if "shape_mismatch" in t), "")
        return Status.SHAPE_MISMATCH, shape
    if not record.get("correctness"):
        failed = [t for t in record.get("trials", []) if not t.get("passed")]
        detail = f"{record.get('correctness_trials', '')} trials passed"
        if failed:
            detail += f"; max difference {failed[0].get('max_difference')}"
        return Status.INCORRECT, detail
    if record.get("error_during_performance"):
        return Status.RUNTIME_ERROR, "failed while timed: " + record["error_during_performance"]
    return Status.PASSED, ""
