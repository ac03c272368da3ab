"""Is it the task? A task that cannot run by itself is the task's problem, never a verdict on a kernel.

A task that raises at import, in `get_init_inputs`, in `Model(...)`, in `get_inputs` or in its forward fails
every kernel checked against it, and the result read as the kernel's: `runtime_error` under `original`,
`unverifiable` (no valid input set) under `verified`, or a worker's "infrastructure" error when the task failed
while the worker loaded it. So after a verdict or an error that a broken task could explain, one worker runs the
task alone, the way every job runs it: its top level, `Model(*get_init_inputs())` and one forward on
`get_inputs()`. If that fails too, the task is named: `check` ends with a TaskError (exit 2: the input is bad),
`rescore` stores the unit as `unverifiable` with the task's error. A passing kernel costs nothing; a failing one
against a sound task costs one short worker, once per task and device.
"""

from __future__ import annotations

import logging
import threading

from kbverify.core.errors import InfrastructureError, TaskError
from kbverify.core.records import Verdict
from kbverify.core.status import Status
from kbverify.core.submissions import make_submission
from kbverify.core.tasks import Task

log = logging.getLogger(__name__)

# Statuses a task that cannot run produces; `incorrect` and the exploits need a reference that ran.
SUSPECT = frozenset({Status.COMPILE_ERROR, Status.RUNTIME_ERROR, Status.CRASHED, Status.TIMEOUT,
                     Status.UNVERIFIABLE})
# The build job runs the task's top level, then this, then one forward of ModelNew(*get_init_inputs()).
_PROBE = make_submission("ModelNew = Model\n", id="task-probe")
# Errors that say the machine failed, not the task: never blamed on it.
_MACHINE = ("CUDA error", "CUDA out of memory", "out of memory", "cuDNN error", "NCCL error")

_known: dict[tuple[str, str], str | None] = {}
_lock = threading.Lock()


def task_failure(task: Task, options) -> str | None:
    """Why `task` cannot run by itself on `options.device` (a `kbverify.harness.runner.CheckOptions`), or None when it
    runs or this machine could not tell (the probe's worker died or reported a machine failure)."""
    key = (task.sha256, options.device)
    with _lock:
        if key in _known:
            return _known[key]
    from kbverify.harness.runner import build_env
    from kbverify.harness.sandbox import run_child

    payload = {"submission_source": _PROBE.source, "task_source": task.source, "task_name": task.name,
               "device": options.device}
    from kbverify.harness.device_share import CORRECTNESS, phase

    # On a shared device the probe is one more correctness worker: never beside another unit's timing.
    with phase(getattr(options, "sharing", None), CORRECTNESS, f"{task.name}/task-probe"):
        outcome = run_child("build", payload, timeout_s=options.timeout_s, device=options.device,
                            env=build_env(_PROBE, options))
    reason = _reason(outcome, options.timeout_s)
    log.info("task probe of %s on %s: %s", task.name, options.device, reason or "runs")
    with _lock:
        _known[key] = reason
    return reason


def _reason(outcome, timeout_s: float) -> str | None:
    if outcome.timed_out:
        return f"it did not load and run one forward within the {timeout_s:g} s a worker is given"
    result = outcome.result or {}
    if outcome.died or "infrastructure_error" in result or result.get("ok", True):
        return None
    error = str(result.get("error") or "it failed").strip()
    if any(marker in error for marker in _MACHINE):
        return None
    return error.splitlines()[-1][:300] if error else "it failed"


def judge(check, task: Task, submission, protocol, options, **fields) -> Verdict:
    """`check(task, submission, protocol, options, **fields)` (`kbverify.harness.runner.check`), with a verdict or an
    infrastructure error that the task itself explains raised as a TaskError naming the task."""
    try:
        verdict = check(task, submission, protocol, options, **fields)
    except InfrastructureError as error:
        reason = task_failure(task, options)
        if reason is None:
            raise
        raise task_error(task, reason) from error
    if verdict.status in SUSPECT:
        reason = task_failure(task, options)
        if reason is not None:
            raise task_error(task, reason)
    return verdict


def task_error(task: Task, reason: str) -> TaskError:
    where = task.path or task.key
    return TaskError(f"task {task.name} ({where}) cannot run by itself: {reason}; no submission was judged "
                     f"against it")
