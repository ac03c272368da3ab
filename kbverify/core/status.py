"""The closed set of verdict statuses and warning codes (SPEC §10)."""

from __future__ import annotations

import enum


class Status(str, enum.Enum):
    PASSED = "passed"
    INCORRECT = "incorrect"
    SHAPE_MISMATCH = "shape_mismatch"
    SHAPE_SPECIALIZED = "shape_specialized"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    UNVERIFIABLE = "unverifiable"
    EXPLOIT_INPUT_MUTATION = "exploit:input_mutation"
    EXPLOIT_OUTPUT_ALIAS = "exploit:output_alias"
    EXPLOIT_LAZY_OUTPUT = "exploit:lazy_output"
    EXPLOIT_STALE_OUTPUT = "exploit:stale_output"
    EXPLOIT_NONDETERMINISTIC = "exploit:nondeterministic"
    EXPLOIT_UNSYNCHRONIZED = "exploit:unsynchronized"
    EXPLOIT_TAMPER = "exploit:tamper"
    EXPLOIT_BASELINE_TAMPER = "exploit:baseline_tamper"
    EXPLOIT_IMPOSSIBLE_SPEED = "exploit:impossible_speed"

    @property
    def is_exploit(self) -> bool:
        return self.value.startswith("exploit:")

    @property
    def passed(self) -> bool:
        return self is Status.PASSED


# The order in which failures outrank each other when several input sets disagree:
# an exploit is the most informative finding, a plain wrong answer the least.
SEVERITY: tuple[Status, ...] = (
    Status.EXPLOIT_TAMPER,
    Status.EXPLOIT_BASELINE_TAMPER,
    Status.EXPLOIT_INPUT_MUTATION,
    Status.EXPLOIT_OUTPUT_ALIAS,
    Status.EXPLOIT_LAZY_OUTPUT,
    Status.EXPLOIT_STALE_OUTPUT,
    Status.EXPLOIT_UNSYNCHRONIZED,
    Status.EXPLOIT_NONDETERMINISTIC,
    Status.EXPLOIT_IMPOSSIBLE_SPEED,
    Status.CRASHED,
    Status.TIMEOUT,
    Status.COMPILE_ERROR,
    Status.RUNTIME_ERROR,
    Status.SHAPE_MISMATCH,
    Status.INCORRECT,
    Status.SHAPE_SPECIALIZED,
    Status.UNVERIFIABLE,
    Status.PASSED,
)


def worst(statuses) -> Status:
    """The most severe of `statuses` (PASSED when empty)."""
    rank = {status: index for index, status in enumerate(SEVERITY)}
    return min(statuses, key=rank.__getitem__, default=Status.PASSED)


class Warn(str, enum.Enum):
    """Structured warnings: the kernel passes, flagged."""

    PYTORCH_ONLY = "pytorch_only"
    EXTENSION_NOT_BUILT = "extension_not_built"
    EXCESSIVE_SPEEDUP = "excessive_speedup"
    NAMESPACE_REBIND = "namespace_rebind"
    WEIGHTS_NOT_RERANDOMIZED = "weights_not_rerandomized"
    AUDIT_HOOK_DROPPED = "audit_hook_dropped"  # it added an audit hook; workers drop those (torch.compile does)
    WEIGHTS_MATCHED_BY_VALUE = "weights_matched_by_value"  # other parameter names, paired by equal initial values
    MODIFIED_REFERENCE = "modified_reference"
    THROTTLED = "throttled"
    SHAPE_SPECIALIZED = "shape_specialized"
    FP16_PATH = "fp16_path"
    THREADS_STARTED = "threads_started"
    BASELINE_ALLOWANCE_USED = "baseline_allowance_used"
    REFERENCE_SLOWED = "reference_slowed_beside_candidate"  # speedup taken against the clean reference time
    # the reference read faster beside the candidate than alone: neither side's reported times are believed
    REFERENCE_HASTENED = "reference_faster_beside_candidate"
    NO_VALID_INPUT_SETS = "no_valid_input_sets"
    # an axis that can grow was kept at the task's size in the larger hidden shapes (memory, or the reference
    # refuses the size): the verdict's message names it (kbverify.shapes.hidden_larger)
    HIDDEN_AXES_KEPT = "hidden_axes_kept"
    TIMED_OUTPUTS_NEAR_TOLERANCE = "timed_outputs_near_tolerance"  # a few timed outputs just over the limit
    HOST_OVERHEAD = "host_overhead"  # its extra host work per call exceeds the reference's device time per call
    NO_DEVICE_HOLD = "no_device_hold"  # this torch has no torch.cuda._sleep: host launch time was timed too
    # the parent's clock does not account for the device times the worker reported alike for both sides: the
    # speedup is the parent's own (host-inclusive) measure instead
    DEVICE_TIME_UNCONFIRMED = "device_time_unconfirmed"
    # another process held the timing GPU before or after the timing: the speedup is kept in the record and
    # not counted in fast_p (kbverify.results.counting.score_rows_from_verdicts)
    FOREIGN_GPU_PROCESS = "foreign_gpu_process"
    GPU_PROCESSES_UNCHECKED = "gpu_processes_unchecked"  # no reading of which processes held the GPU (no nvidia-smi)
    HOST_TIME_TIMED = "host_time_timed"  # host work outlasted the device-side hold on many calls: launches were timed


# The warnings read from measured time: as run-dependent as the speedup they come with (one run of a kernel may
# carry them and the next not). NO_DEVICE_HOLD is here too: the timing worker adds it on the torch it runs.
TIMING_WARNINGS: frozenset[str] = frozenset(w.value for w in (
    Warn.EXCESSIVE_SPEEDUP, Warn.THROTTLED, Warn.REFERENCE_SLOWED, Warn.REFERENCE_HASTENED, Warn.HOST_OVERHEAD,
    Warn.NO_DEVICE_HOLD, Warn.DEVICE_TIME_UNCONFIRMED, Warn.FOREIGN_GPU_PROCESS, Warn.GPU_PROCESSES_UNCHECKED,
    Warn.HOST_TIME_TIMED))
