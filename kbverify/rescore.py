"""Re-scoring a published run: every entry × protocol is one unit of work, stored as it finishes.

Native builds are made first, in parallel on the CPU cores, keyed by content hash; then one worker thread per
device takes units from a shared queue (each unit runs in its own sandboxed children). A killed run resumes: units
already in the store are skipped, and a unit is written in one transaction, so nothing is lost or duplicated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import queue
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable

from kbverify import provenance as provenance_module
from kbverify import task_probe
from kbverify.errors import InfrastructureError, TaskError
from kbverify.importers import Entry
from kbverify.progress import Progress, estimate_left_s
from kbverify.protocols import Protocol
from kbverify.records import Verdict, task_label
from kbverify.runner import CheckOptions, build_env, check
from kbverify.sandbox import run_child
from kbverify.static import scan
from kbverify.status import Status, Warn
from kbverify.store import Store

log = logging.getLogger(__name__)

BUILD_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Unit:
    key: str
    entry: Entry
    protocol: Protocol


@dataclass(frozen=True)
class RescoreSummary:
    units: int
    evaluated: int
    resumed: int
    errors: tuple[str, ...]
    wall_s: float


def unit_key(entry: Entry, protocol: Protocol) -> str:
    parts = [entry.entry_id, str(entry.sample), protocol.sha256,
             entry.task.sha256 if entry.task else "-", entry.submission.sha256 if entry.submission else "-"]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def plan_units(entries: list[Entry], protocols: list[Protocol]) -> list[Unit]:
    return [Unit(unit_key(entry, protocol), entry, protocol) for entry in entries for protocol in protocols]


def entry_task_name(entry: Entry) -> str:
    """The task name its verdicts carry; an entry whose task could not be loaded falls back on its problem id, or
    on its own id, so two such entries never look like one task."""
    if entry.task is not None:
        return entry.task.name
    return str(entry.problem_id) if entry.problem_id is not None else entry.entry_id


def unverifiable_verdict(entry: Entry, protocol: Protocol) -> Verdict:
    task = entry.task
    return Verdict(task=task.key if task else f"level{entry.level}/{entry_task_name(entry)}",
                   task_name=entry_task_name(entry), level=entry.level, problem_id=entry.problem_id,
                   submission=entry.entry_id,
                   submission_sha256=entry.submission.sha256 if entry.submission else "", protocol=protocol.name,
                   protocol_sha256=protocol.sha256, status=Status.UNVERIFIABLE, message=entry.unverifiable or "",
                   claimed_speedup=entry.claimed_speedup, sample=entry.sample, labels=dict(entry.labels))


def prebuild(entries: list[Entry], options: CheckOptions, *, workers: int | None = None,
             progress: Callable[[Progress], None] | None = None) -> dict[str, dict]:
    """Run each native submission's module level once, in parallel, so later evaluation finds its build cached.
    `progress` hears of the phase's start and of every finished build."""
    unique = {}
    for entry in entries:
        if entry.submission and entry.task and scan(entry.submission.source).native_sources:
            unique.setdefault(entry.submission.sha256, (entry.submission, entry.task))
    if not unique:
        return {}
    workers = workers or max(1, os.cpu_count() or 1)
    log.info("prebuilding %d native submissions on %d workers", len(unique), workers)

    def build(pair):
        submission, task = pair
        payload = {"submission_source": submission.source, "task_source": task.source, "task_name": task.name,
                   "device": options.device}
        outcome = run_child("build", payload, timeout_s=BUILD_TIMEOUT_S, device=options.device,
                            env=build_env(submission, options))
        return submission.sha256, (outcome.result or {"ok": False, "error": "build timed out" if outcome.timed_out
                                                      else f"build process died (exit {outcome.exit_code})"})

    started, built = time.monotonic(), {}
    if progress:
        progress(Progress(0, len(unique), phase="build", device="cpu", workers=workers))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for future in as_completed([pool.submit(build, pair) for pair in unique.values()]):
            sha256, result = future.result()
            built[sha256] = result
            if progress:
                spent = time.monotonic() - started
                progress(Progress(len(built), len(unique), eta_s=spent / len(built) * (len(unique) - len(built)),
                                  last=f"{unique[sha256][0].id} {'built' if result.get('ok') else 'failed'}",
                                  phase="build", device="cpu", workers=workers))
    return built


def rescore(entries: list[Entry], protocols: list[Protocol], store: Store, *, run_id: str, devices: list[str],
            options: CheckOptions, progress: Callable[[Progress], None] | None = None,
            build_workers: int | None = None, arguments: dict | None = None) -> RescoreSummary:
    started = time.monotonic()
    units = plan_units(entries, protocols)
    if progress:  # before the machine is probed for provenance: that can take seconds on a GPU host
        progress(Progress(0, len(units), phase="start", device=devices[0], workers=len(devices)))
    # The plan goes with the run, so `score` and `report` of the store can tell which units have no verdict.
    planned = {unit.key: planned_unit(unit) for unit in units}
    store.begin_run(run_id, provenance_module.collect(devices[0]), {**(arguments or {}), "planned_units": planned},
                    allow_mixed=bool((arguments or {}).get("allow_mixed")))
    todo = [unit for unit in units if not store.has(unit.key)]
    resumed = len(units) - len(todo)
    lock = threading.Lock()
    for unit in [u for u in todo if not u.entry.verifiable]:
        with lock:
            store.put(unit.key, run_id, unverifiable_verdict(unit.entry, unit.protocol))
    todo = [u for u in todo if u.entry.verifiable]
    if todo:
        prebuild([u.entry for u in todo], dataclasses.replace(options, device=devices[0]), workers=build_workers,
                 progress=progress)
    work: queue.Queue = queue.Queue()
    for unit in todo:
        work.put(unit)
    errors: list[str] = []
    failures: list[BaseException] = []
    done = [0]
    durations: dict[str, list[float]] = {}  # per protocol: a verified unit takes many times a KernelBench one
    pending = Counter(unit.protocol.name for unit in todo)
    if progress:
        progress(Progress(0, len(todo), resumed, phase="evaluate", device=devices[0], workers=len(devices)))

    def worker(device: str) -> None:
        device_options = dataclasses.replace(options, device=device)
        while not failures:
            try:
                unit = work.get_nowait()
            except queue.Empty:
                return
            unit_started = time.monotonic()
            try:
                verdict = evaluate_unit(unit, device_options, store, lock)
            except InfrastructureError as error:
                with lock:
                    errors.append(f"{unit.entry.entry_id} [{unit.protocol.name}]: {error}")
                    pending[unit.protocol.name] -= 1
                log.error("infrastructure error on %s: %s", unit.entry.entry_id, error)
                continue
            except BaseException as error:  # a bug of ours: stop every thread and raise it in the caller
                with lock:
                    failures.append(error)
                return
            with lock:
                store.put(unit.key, run_id, verdict)
                done[0] += 1
                durations.setdefault(unit.protocol.name, []).append(time.monotonic() - unit_started)
                pending[unit.protocol.name] -= 1
                if progress:
                    progress(Progress(done[0], len(todo), resumed, estimate_left_s(durations, pending, len(devices)),
                                      f"{unit.entry.entry_id} [{unit.protocol.name}] {verdict.status.value}",
                                      phase="evaluate", device=device, workers=len(devices)))

    threads = [threading.Thread(target=worker, args=(device,), daemon=True) for device in devices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        # Finished units are in the store; a rerun resumes after the fix.
        raise failures[0]
    return RescoreSummary(units=len(units), evaluated=done[0], resumed=resumed, errors=tuple(errors),
                          wall_s=time.monotonic() - started)


def planned_unit(unit: Unit) -> dict:
    """What a store keeps of a planned unit: its name, and what scores it as a failure if it never gets a verdict
    (the task as the score tables name it, its level, sample and protocol)."""
    task = unit.entry.task
    level = task.level if task is not None else unit.entry.level
    # The task as its verdict will name it (`unverifiable_verdict` for an entry without a task), so a store can
    # tell a second version of one unit from another unit (`Store.refuse_conflicts`).
    return {"name": f"{unit.entry.entry_id} [{unit.protocol.name}]", "task": task_label(entry_task_name(unit.entry),
                                                                                         level),
            "level": level, "sample": unit.entry.sample, "protocol": unit.protocol.name,
            "labels": dict(unit.entry.labels)}


class _LockedCache:
    """The store's A/A margin cache, shared by device threads."""

    def __init__(self, store: Store, lock: threading.Lock):
        self.store, self.lock = store, lock

    def get(self, key):
        with self.lock:
            return self.store.cache_get(key)

    def put(self, key, value):
        with self.lock:
            self.store.cache_put(key, value)


def evaluate_unit(unit: Unit, options: CheckOptions, store: Store | None = None,
                  lock: threading.Lock | None = None) -> Verdict:
    entry = unit.entry
    cache = _LockedCache(store, lock) if store is not None and lock is not None else None
    try:
        verdict = task_probe.judge(check, entry.task, entry.submission, unit.protocol, options, sample=entry.sample,
                                   claimed_speedup=entry.claimed_speedup, margin_cache=cache)
    except TaskError as error:  # the task's problem: no verdict on the kernel, its claim stays unverified
        return dataclasses.replace(unverifiable_verdict(entry, unit.protocol), message=str(error))
    verdict = dataclasses.replace(verdict, submission=entry.entry_id, labels=dict(entry.labels))
    if entry.modified_reference:
        verdict = dataclasses.replace(verdict, warnings=verdict.warnings + (Warn.MODIFIED_REFERENCE.value,))
    return verdict
