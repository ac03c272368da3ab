"""Running the audit: one sandboxed child per task (`kbverify.worker.audit_worker`), its raw numbers appended to
the partial file and judged by `kbverify.audit.judge`."""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kbverify.audit.judge import assess
from kbverify.audit.partial import append_line, partial_lines, raw_path, read_partial, settings_fingerprint
from kbverify.audit.protocols import null_kernel_protocols, resolve_protocols, with_identity_variants
from kbverify.audit.records import AuditReport, AuditSettings, AuditThresholds, TaskAudit
from kbverify.audit.report import write_report
from kbverify.core.errors import InputError
from kbverify.core.protocols import Protocol
from kbverify.core.tasks import Task, load_task_dir
from kbverify.harness.sandbox import run_child, start_early

log = logging.getLogger(__name__)

DEFERRED_WAIT_S = 0.5  # how long an auditor whose every remaining task is deferred waits before asking again


def audit_tasks(tasks: Sequence[Task] | str | Path, *, protocols: Sequence[Protocol | str], device: str = "cpu",
                out_prefix: str | Path | None = None, resume: bool = True,
                progress: Callable[[int, int, TaskAudit], None] | None = None,
                settings: AuditSettings | None = None, thresholds: AuditThresholds | None = None,
                title: str | None = None, claim: Callable[[Task], bool | None] | None = None,
                release: Callable[[Task], None] | None = None, run: bool = True) -> AuditReport:
    """Audit every task; with `out_prefix`, append each task's raw result to `<prefix>.partial.jsonl` as it
    finishes (a rerun skips those, unless they errored) and write `<prefix>.json` and `<prefix>.md` at the end.
    With `claim`, a task not yet done is audited only when claim(task) is true (several auditors sharing one
    task list, each taking the next unclaimed task); the tasks left to others are not in the returned report.
    claim(task) None means "not now" (it does not fit in memory beside the others' tasks): the task is deferred,
    the next one in order tried, and the deferred ones asked again, first, whenever this auditor is free; when
    nothing can start it waits. `release(task)` is called when a task it claimed has ended, however it ended.
    With `run=False` nothing runs: a report of what the partial file holds, where a task without a result shows
    its last recorded error (or that it was never audited), so a cut-short audit is reported as such."""
    if isinstance(tasks, (str, Path)):
        title = title or Path(tasks).name
        tasks = load_task_dir(tasks)
    plan = _plan(protocols, device, out_prefix, settings or AuditSettings(), thresholds or AuditThresholds(),
                 resume=resume, run=run)
    if run:
        start_early(timing=False)  # audit workers never run the interleaved timing (sandbox.TIMING_PRELOAD)
    started = time.monotonic()
    audits: list[TaskAudit] = []
    lines: list[dict] = []
    queue = list(tasks)
    index = 0
    while queue:
        picked = _next_task(queue, plan.done, claim)
        if picked is None:  # every task left is deferred: wait for memory to free up
            time.sleep(DEFERRED_WAIT_S)
            continue
        task, verdict = picked
        queue.remove(task)
        index += 1
        if verdict == "elsewhere":
            continue
        line = _line_for(task, plan, release if verdict == "claimed" else None)
        lines.append(line)
        audit = assess(task, line, protocols=plan.protocols, thresholds=plan.thresholds,
                       distributions=plan.settings.distributions, resumed=task.key in plan.done)
        audits.append(audit)
        _log_audit(audit, index, len(tasks))
        if progress is not None:
            progress(index, len(tasks), audit)
    report = AuditReport(tasks=tuple(audits), protocols=tuple(p.name for p in plan.protocols),
                         thresholds=plan.thresholds, settings=plan.settings, device=device,
                         wall_s=time.monotonic() - started,
                         title=title or (Path(out_prefix).name if out_prefix is not None else "audit"),
                         provenance=_provenance(lines))
    if out_prefix is not None:
        write_report(report, out_prefix)
    return report


@dataclass(frozen=True)
class _Plan:
    """What every task of one `audit_tasks` call shares: the settings, the protocols as the worker and the judge
    take them, and the partial file's state when the audit started."""

    protocols: list[Protocol]
    judged: list[Protocol]  # the protocols plus their every-distribution variants, as the worker tracks them
    device: str
    settings: AuditSettings
    thresholds: AuditThresholds
    worker_settings: dict
    judged_by: dict[str, list[str]]
    fingerprint: str
    partial: Path | None
    done: dict[str, dict]  # key → a finished line of these settings, resumed
    failed: dict[str, dict]  # key → a line without a result (only read when nothing runs)
    run: bool


def _plan(protocols: Sequence[Protocol | str], device: str, out_prefix: str | Path | None, settings: AuditSettings,
          thresholds: AuditThresholds, *, resume: bool, run: bool) -> _Plan:
    if thresholds.timing_min_us > settings.timing_decided_us:
        # the worker stops timing once the median is decided up to timing_decided_us, not beyond
        raise InputError(f"timing_min_us {thresholds.timing_min_us:g} is above the {settings.timing_decided_us:g} µs "
                         "the timing flag is decided up to (AuditSettings.timing_decided_us)")
    protocols = resolve_protocols(protocols)
    fingerprint = settings_fingerprint(protocols=protocols, device=device, settings=settings)
    partial = Path(f"{out_prefix}.partial.jsonl") if out_prefix is not None else None
    # a finished audit's lines are in the raw file (`finish_partial`), a running or cut one's in the partial file
    files = [raw_path(partial), partial] if partial is not None else []
    done = {key: line for path in files for key, line in read_partial(path, fingerprint).items()} if resume else {}
    failed = ({line["key"]: line for path in files for line in partial_lines(path) if line.get("raw") is None}
              if not run else {})
    if partial is not None:
        partial.parent.mkdir(parents=True, exist_ok=True)
        if not resume:
            partial.write_text("")
            raw_path(partial).unlink(missing_ok=True)
    return _Plan(protocols=protocols, judged=with_identity_variants(protocols, settings.distributions),
                 device=device, settings=settings, thresholds=thresholds, worker_settings=settings.worker_dict(),
                 judged_by=null_kernel_protocols(protocols, settings), fingerprint=fingerprint, partial=partial,
                 done=done, failed=failed, run=run)


def _line_for(task: Task, plan: _Plan, release: Callable[[Task], None] | None) -> dict:
    """The task's partial-file line: resumed, run now (and appended), or, when nothing runs, its last error."""
    line = plan.done.get(task.key)
    if line is None and not plan.run:
        line = plan.failed.get(task.key) or {"key": task.key, "raw": None, "wall_s": 0.0,
                                             "error": "not audited: no result in the partial file"}
    elif line is None:
        line = _run_claimed(task, plan.worker_settings, plan.judged, plan.device, plan.settings.timeout_s,
                            plan.judged_by, release)
        line["settings_sha256"] = plan.fingerprint
        if plan.partial is not None:
            append_line(plan.partial, line)
    return line


def _log_audit(audit: TaskAudit, index: int, total: int) -> None:
    log.info("[%d/%d] %s%s: %s%s (%.1f s)", index, total, audit.task, " (resumed)" if audit.resumed else "",
             "DEGENERATE " if audit.degenerate else "", ", ".join(audit.flags) or audit.error or "no flags",
             audit.wall_s)


def _next_task(queue: list[Task], done: dict, claim) -> tuple[Task, str] | None:
    """The first task in `queue` that can be taken now, with why: "resumed", "free" (no claims), "claimed", or
    "elsewhere" (another auditor has it). None when every task left is deferred."""
    for task in queue:
        if task.key in done:
            return task, "resumed"
        if claim is None:
            return task, "free"
        verdict = claim(task)
        if verdict is not None:
            return task, "claimed" if verdict else "elsewhere"
    return None


def _run_claimed(task: Task, worker_settings: dict, judged: list[Protocol], device: str, timeout_s: float,
                 judged_by: dict, release: Callable[[Task], None] | None) -> dict:
    """Run one task, its start and end times on the line (so overlaps between auditors can be checked), and
    release its claim's reservation however it ended."""
    started = time.time()
    try:
        line = _run_task(task, worker_settings, judged, device, timeout_s, judged_by)
    finally:
        if release is not None:
            release(task)
    line["started_unix_s"], line["ended_unix_s"] = started, time.time()
    return line


def _payload(task: Task, worker_settings: dict, protocols: list[Protocol], device: str,
             judged_by: dict[str, list[str]] | None) -> dict:
    return {"task_source": task.source, "task_name": task.name, "device": device,
            "settings": worker_settings, "protocols": [p.to_dict() for p in protocols],
            "committed_shapes": _committed_shapes(task, worker_settings), "null_kernel_protocols": judged_by}


def worker_payload(task: Task, *, protocols: Sequence[Protocol | str], settings: AuditSettings,
                   device: str) -> dict:
    """What the audit worker is given for `task`, as `audit_tasks` gives it (for tools that run the worker
    in their own process)."""
    protocols = resolve_protocols(protocols)
    return _payload(task, settings.worker_dict(), with_identity_variants(protocols, settings.distributions),
                    device, null_kernel_protocols(protocols, settings))


def _run_task(task: Task, worker_settings: dict, protocols: list[Protocol], device: str,
              timeout_s: float, judged_by: dict[str, list[str]] | None = None) -> dict:
    payload = _payload(task, worker_settings, protocols, device, judged_by)
    outcome = run_child("audit", payload, timeout_s=timeout_s, device=device)
    line = {"key": task.key, "name": task.name, "level": task.level, "sha256": task.sha256, "path": task.path,
            "wall_s": outcome.wall_s, "raw": None, "error": None}
    if outcome.timed_out:
        line["error"] = f"timeout after {timeout_s:g} s (last phase: {outcome.last_phase or 'start'})"
    elif outcome.result is None:
        output = (outcome.output_tail or outcome.output_head).strip()[-400:]
        line["error"] = (f"worker died (exit code {outcome.exit_code}, last phase: {outcome.last_phase or 'start'})"
                         + (f": {output}" if output else ""))
    elif "infrastructure_error" in outcome.result:
        line["error"] = f"worker failed: {outcome.result['infrastructure_error']}"
    else:
        line["raw"] = outcome.result
    return line


def _committed_shapes(task: Task, worker_settings: dict) -> list[dict] | None:
    """Manifests are read here, by the parent: the worker runs in a directory of its own, where the paths given
    on the command line (often relative) mean nothing. None: no manifest, the worker generates shapes."""
    if not worker_settings.get("hidden_shapes"):
        return None
    from kbverify.shapes import hidden

    try:
        shapes = hidden.committed_shapes(task, worker_settings.get("hidden_dirs", []))
    except InputError as error:  # one broken manifest must not stop an audit of 250 tasks
        log.warning("%s: %s; its hidden shapes are generated instead", task.name, error)
        return None
    return None if shapes is None else [shape.to_json() for shape in shapes]


def _provenance(lines: list[dict]) -> dict:
    raws = [line["raw"] for line in lines if line.get("raw")]
    return {"created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": sorted({r.get("torch", "") for r in raws}),
            "gpu": sorted({r["gpu"] for r in raws if r.get("gpu")})}
