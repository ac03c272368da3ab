"""`kbverify audit` beyond one audit of a folder: levels, settings, and copies sharing the GPUs of one host.

One invocation with `--gpus N` (and `--per-gpu K`) estimates every task's memory, runs N·K copies of itself
(`kbverify.audit.copies`) under a private MPS daemon where there is one, audits again with fewer copies what
failed among many (out of memory, mostly; and without MPS, so a task whose GPU broke under MPS is audited on
contexts of its own), then takes what is still missing one task at a time and writes the report from the merged
partial file. A rerun of the same command resumes."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from kbverify.audit.copies import copy_claims, run_shards, shard_files, sharing
from kbverify.audit.gpu_sampler import GpuSampler
from kbverify.audit.memory import memory_check, memory_needs, update_peaks
from kbverify.audit.options import AuditOptions
from kbverify.audit.partial import finish_partial, merge_partials
from kbverify.audit.published import compare_with_published
from kbverify.audit.records import AuditReport
from kbverify.audit.report import audit_to_json_summary, summary_lines
from kbverify.audit.run import audit_tasks
from kbverify.core.errors import InputError
from kbverify.core.protocols import parse_protocols
from kbverify.core.tasks import Task, load_task_dir
from kbverify.harness.mps import MpsState

log = logging.getLogger(__name__)


def run_audit_options(options: AuditOptions) -> dict:
    """Run the audit `options` describe. Returns {"text", "json"}: what the command prints (json None where there
    is no report to print: a copy, whose parent reports, or --estimate-only)."""
    started = time.monotonic()
    tasks = load_tasks(options)
    if options.report_only:
        merge_partials(options.partial, shard_files(options.out_prefix), options.fingerprint())
    if options.estimate_only:
        memory_needs(options, tasks)
        return {"text": "", "json": None}
    needs, state = None, MpsState(False, "one copy")
    if options.sharded and not options.report_only:
        needs = memory_needs(options, tasks)
        state = _run_copies(options, needs)
    elif options.peaks is not None and not options.report_only:
        log.warning("--peaks serves the copies' memory admission; one copy runs without it and leaves %s as it was",
                    options.peaks)
    report = _final_pass(options, tasks, started)
    if options.shard:
        return {"text": "", "json": None}
    notes = _notes(options, report, needs, state)
    raw = finish_partial(options.partial, options.fingerprint())
    wall_s = time.monotonic() - started
    notes.append(f"\nwrote {options.out_prefix}.json, {options.out_prefix}.md and {raw.name} (the raw lines)")
    notes.append(f"total wall time: {wall_s:.0f} s ({wall_s / 60:.1f} min) for {len(tasks)} tasks")
    summary = audit_to_json_summary(report)
    return {"text": "\n".join(summary_lines(summary) + notes) + "\n", "json": summary}


def load_tasks(options: AuditOptions) -> list[Task]:
    """The tasks of the levels asked for; a copy given `--shard K/N` without claims takes every N-th from K."""
    tasks = [t for t in load_task_dir(options.tasks) if options.levels is None or t.level in options.levels]
    if not tasks:
        levels = ",".join(map(str, options.levels or ()))
        raise InputError(f"{options.tasks}: no tasks" + (f" of levels {levels}" if levels else ""))
    if options.shard and options.claims is None:
        index, count = (int(part) for part in options.shard.split("/"))
        tasks = tasks[index::count]
    return tasks


def _run_copies(options: AuditOptions, needs: dict) -> MpsState:
    """The sharded pass, then what failed among many copies again among fewer, without MPS; the serial pass
    (`_final_pass`) takes the rest."""
    sampler = GpuSampler.start(options.out_prefix.with_name(options.out_prefix.name + ".gpu_samples.csv")) \
        if options.on_cuda else None
    try:
        with sharing(options) as state:
            run_shards(options, options.per_gpu, fresh=options.fresh, needs=needs, env=state.env)
        if options.retry_per_gpu and options.retry_per_gpu < options.per_gpu:
            run_shards(options, options.retry_per_gpu, fresh=False, needs=needs)
    finally:
        if sampler is not None:
            log.info("%s", sampler.stop())
    return state


def _final_pass(options: AuditOptions, tasks: Sequence[Task], started: float) -> AuditReport:
    """This invocation's own audit: a copy's share of the list, or, after the copies, every task (resumed from
    the merged partial file, the rest run here one at a time)."""
    claim = release = None
    if options.claims:
        tasks, claim, release = copy_claims(options, tasks)
    return audit_tasks(tasks, protocols=parse_protocols(options.protocol), device=options.device,
                       out_prefix=options.out_prefix,
                       resume=options.sharded or options.report_only or not options.fresh,
                       progress=_progress(started), settings=options.settings(), claim=claim, release=release,
                       title=options.tasks.name, run=not options.report_only)


def _progress(started: float):
    fresh_runs: list[float] = []

    def progress(done: int, total: int, audit) -> None:
        if not audit.resumed:
            fresh_runs.append(audit.wall_s)
        elapsed = time.monotonic() - started
        rate = elapsed / max(1, len(fresh_runs))
        log.info("%d/%d done, %.0f s elapsed, about %.0f min left", done, total, elapsed,
                 rate * (total - done) / 60 if fresh_runs else 0.0)

    return progress


def _notes(options: AuditOptions, report: AuditReport, needs: dict | None, state: MpsState) -> list[str]:
    notes = [compare_with_published(report)] if options.compare_published else []
    if needs is not None:
        notes.append(memory_check(options.partial, needs["needs"]))
        if options.peaks is not None:
            notes.append(update_peaks(options.peaks, options.partial, options.fingerprint()))
        notes.append(f"\ncopies per device: {options.per_gpu}; {state.describe()}")
    return notes
