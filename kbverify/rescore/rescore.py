"""Re-scoring a published run: every entry × protocol is one unit of work, stored as it finishes.

An executor runs the units. The local one (`LocalExecutor`) is a pipeline: native builds, keyed by content hash,
run on the CPU cores (`kbverify.rescore.builds`: one build per free core) while threads per device evaluate every unit that is ready
(each unit in its own sandboxed children): one per device, or several sharing it through its lease
(`kbverify.harness.device_share`: correctness side by side, timing alone); `kbverify.rescore.ray_executor` runs units as Ray
tasks. Verdicts come back to the driver's store (`Sink`). A killed run resumes: units already in the store are skipped, and a unit is written in
one transaction, so nothing is lost or duplicated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from kbverify import judge
from kbverify.harness import provenance as provenance_module
from kbverify.harness import task_probe
# the build part, in its own module; named here too for the pipeline below and older callers
from kbverify.rescore.builds import (BUILD_TIMEOUT_S, BuildPlan, build_plan, build_submission,  # noqa: F401
                             default_build_plan, needs_build, prebuild)
from kbverify.core.errors import InfrastructureError, TaskError
from kbverify.core.progress import Progress, estimate_left_s
from kbverify.core.protocols import Protocol
from kbverify.core.records import Verdict, task_label
from kbverify.core.status import Warn
from kbverify.harness.device_share import DeviceLease, Sharing, batch_for, default_wait_s, ran_out_of_memory, threads_for
from kbverify.harness.mps import MpsState, private_mps
from kbverify.harness.runner import CheckOptions, check
from kbverify.rescore.importers import Entry
from kbverify.rescore.rescore_memory import Admission, device_budget_bytes, ledger_for, unit_needs
from kbverify.results.store import Store

log = logging.getLogger(__name__)

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
    status, message = judge.unloadable_entry(entry.unverifiable or "")
    return Verdict(task=task.key if task else f"level{entry.level}/{entry_task_name(entry)}",
                   task_name=entry_task_name(entry), level=entry.level, problem_id=entry.problem_id,
                   submission=entry.entry_id,
                   submission_sha256=entry.submission.sha256 if entry.submission else "", protocol=protocol.name,
                   protocol_sha256=protocol.sha256, status=status, message=message,
                   claimed_speedup=entry.claimed_speedup, sample=entry.sample, labels=dict(entry.labels))


def mps_for(devices: list[str], stack: contextlib.ExitStack) -> MpsState:
    """A private MPS daemon for the run, entered on `stack`, where a device is a GPU (none on a CPU)."""
    if not any(device.startswith("cuda") for device in devices):
        return MpsState(False, "not a GPU")
    if os.environ.get("KBVERIFY_MPS", "").lower() in ("0", "off", "no"):
        return MpsState(False, "KBVERIFY_MPS=off")
    # A short folder of its own: the daemon's sockets must fit a Unix socket path (108 bytes).
    folder = Path(tempfile.mkdtemp(prefix="kbv-mps-"))
    stack.callback(shutil.rmtree, folder, ignore_errors=True)
    return stack.enter_context(private_mps(folder))


class Sink:
    """Where an executor's results go: verdicts into the driver's store (one transaction each, so a cut run
    resumes), infrastructure errors into the summary, progress to the caller. Thread-safe."""

    def __init__(self, store: Store, run_id: str, todo: list[Unit], resumed: int,
                 progress: Callable[[Progress], None] | None, workers: int, device: str, compat_key: str = "",
                 devices: int | None = None):
        self.store, self.run_id, self.progress = store, run_id, progress
        self.devices = devices  # the devices the workers share (a GPU evaluates several units side by side)
        self.compat_key = compat_key  # the run's machine and software (`kbverify.harness.provenance.compat_key`)
        self.lock = threading.Lock()
        self.total, self.resumed, self.workers, self.device = len(todo), resumed, workers, device
        self.done = 0
        self.errors: list[str] = []
        self.failures: list[BaseException] = []
        self.durations: dict[str, list[float]] = {}  # per protocol: a verified unit takes many times an original one
        self.pending = Counter(unit.protocol.name for unit in todo)
        self.builds_started = self.evaluation_started = time.monotonic()

    @property
    def stopped(self) -> bool:
        return bool(self.failures)

    def verdict(self, unit: Unit, verdict: Verdict, seconds: float, device: str) -> None:
        with self.lock:
            self.store.put(unit.key, self.run_id, verdict)
            self.done += 1
            self.durations.setdefault(unit.protocol.name, []).append(seconds)
            self.pending[unit.protocol.name] -= 1
            if self.progress:
                self.progress(Progress(self.done, self.total, self.resumed,
                                       estimate_left_s(self.durations, self.pending, self.workers,
                                                       elapsed_s=time.monotonic() - self.evaluation_started),
                                       f"{unit.entry.entry_id} [{unit.protocol.name}] {verdict.status.value}",
                                       phase="evaluate", device=device, workers=self.workers,
                                       devices=self.devices))

    def error(self, unit: Unit, message: str) -> None:
        with self.lock:
            self.errors.append(f"{unit.entry.entry_id} [{unit.protocol.name}]: {message}")
            self.pending[unit.protocol.name] -= 1
        log.error("infrastructure error on %s: %s", unit.entry.entry_id, message)

    def failure(self, error: BaseException) -> None:
        """A bug of ours: every worker stops taking units, and the caller raises it."""
        with self.lock:
            self.failures.append(error)

    def evaluation_starts(self) -> None:
        self.evaluation_started = time.monotonic()
        if self.progress:
            self.progress(Progress(0, self.total, self.resumed, phase="evaluate", device=self.device,
                                   workers=self.workers, devices=self.devices))

    def builds(self, done: int, total: int, workers: int, last: str = "") -> None:
        if not self.progress:
            return
        spent = time.monotonic() - self.builds_started
        with self.lock:
            self.progress(Progress(done, total, eta_s=spent / done * (total - done) if done else None, last=last,
                                   phase="build", device="cpu", workers=workers))

    def margin_cache(self) -> "_LockedCache":
        return _LockedCache(self.store, self.lock)


class LocalExecutor:
    """This machine's executor: native builds on the CPU cores (`BuildPlan`) and `share` evaluating threads per
    device, overlapped. A unit is ready when its submission needs no build or its build has finished (built or
    failed: a failure is remembered in the build cache and becomes the unit's compile_error), so the first
    evaluation starts as soon as the first unit is ready, not after the last build. With `share` = 1 a device
    evaluates one unit at a time, so a unit's timing has its GPU alone. With more, the units of a device share it
    through its lease (`kbverify.harness.device_share`): up to `share` correctness phases side by side (on a private MPS
    daemon where the device is a GPU), every timing phase alone."""

    def __init__(self, devices: list[str], options: CheckOptions, plan: BuildPlan | None = None, share: int = 1):
        if share < 1:
            raise ValueError("share is the units evaluated side by side per device, at least 1")
        self.devices, self.share = devices, share
        self.plan = plan or default_build_plan(len(devices) * share)
        self.options = dataclasses.replace(options, max_jobs=self.plan.max_jobs)
        self.sharing: dict[str, Sharing] = {}  # device → its lease, while a session runs
        self.ledgers: dict = {}  # device → its memory ledger (`kbverify.rescore.rescore_memory`), a GPU's while sharing
        self.needs: dict[str, int | None] = {}  # unit key → its expected device memory, for the ledgers
        self.observer = None  # called with every LeaseEvent (tests)

    @property
    def workers(self) -> int:
        return len(self.devices) * threads_for(self.share)

    def provenance(self, device: str) -> dict:
        info = provenance_module.collect(device)
        if device in self.sharing:
            info["device_share"] = self.sharing[device].provenance()
        return info

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """What a run holds: with `share` > 1, one lease per device and, where a device is a GPU, a private MPS
        daemon for the correctness workers (KBVERIFY_MPS=off runs them without one); its state is in the run's
        provenance and every verdict's."""
        if self.share == 1:
            yield
            return
        with contextlib.ExitStack() as stack:
            state = mps_for(self.devices, stack)
            wait_s = default_wait_s(self.share, self.options.timeout_s)
            self.sharing = {device: Sharing(DeviceLease(device, self.share, wait_s=wait_s, observer=self.observer,
                                                        batch=batch_for(self.share)),
                                            tuple(state.env.items()), state.used, state.reason)
                            for device in self.devices}
            log.info("%d units side by side per device (correctness; timing alone); %s", self.share,
                     state.describe())
            folder = Path(tempfile.mkdtemp(prefix="kbv-memory-"))
            stack.callback(shutil.rmtree, folder, ignore_errors=True)
            self.ledgers = {device: ledger for device in self.devices
                            if (ledger := ledger_for(folder, device, device_budget_bytes(device))) is not None}
            try:
                yield
            finally:
                self.sharing, self.ledgers = {}, {}

    def run(self, units: list[Unit], sink: Sink) -> None:
        if self.ledgers:  # the needs read the store's recorded peaks before the first unit starts
            with sink.lock:
                verdicts = [verdict for _, verdict in sink.store.verdicts()]
            self.needs = unit_needs(units, verdicts, provenance_module.gpu_model())
        ready: queue.Queue = queue.Queue()
        waiting: dict[str, list[Unit]] = {}  # submission hash → its units, held until it is built
        for unit in units:
            if needs_build(unit.entry):
                waiting.setdefault(unit.entry.submission.sha256, []).append(unit)
            else:
                ready.put(unit)
        sink.evaluation_starts()
        builder = threading.Thread(target=self._build_all, args=(waiting, ready, sink), name="kbverify-builds",
                                   daemon=True)
        builder.start()
        threads = [threading.Thread(target=self._evaluate_from, args=(ready, device, sink), daemon=True,
                                    name=f"kbverify-evaluate-{index}-{slot}")
                   for index, device in enumerate(self.devices) for slot in range(threads_for(self.share))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        builder.join()

    def _build_all(self, waiting: dict[str, list[Unit]], ready: queue.Queue, sink: Sink) -> None:
        """Builds in source order, `parallel_builds` at a time; each finished build releases its units. One
        end-of-work marker per device follows the last of them."""
        try:
            if waiting:
                self._build_in_pool(waiting, ready, sink)
        finally:
            for _ in range(self.workers):  # one end-of-work marker per evaluating thread
                ready.put(None)

    def _build_in_pool(self, waiting: dict[str, list[Unit]], ready: queue.Queue, sink: Sink) -> None:
        workers, total = self.plan.parallel_builds, len(waiting)
        log.info("building %d native submissions, %d at a time with MAX_JOBS=%d, beside the evaluation", total,
                 workers, self.plan.max_jobs)
        sink.builds(0, total, workers)
        build_options = dataclasses.replace(self.options, device=self.devices[0])
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kbverify-build") as pool:
            futures = {pool.submit(build_submission, group[0].entry, build_options): sha256
                       for sha256, group in waiting.items()}
            for done, future in enumerate(as_completed(futures), start=1):
                if sink.stopped:
                    pool.shutdown(wait=False, cancel_futures=True)
                    return
                group = waiting[futures[future]]
                try:
                    result = future.result()
                except BaseException as error:  # a bug of ours
                    sink.failure(error)
                    return
                for unit in group:
                    ready.put(unit)
                sink.builds(done, total, workers, f"{group[0].entry.entry_id} "
                                                  f"{'built' if result.get('ok') else 'failed'}")

    @staticmethod
    def _evaluate_once_more_alone(unit, device_options: CheckOptions, sink: Sink) -> Verdict:
        """A unit that ran out of memory beside others, as a verdict or as kbverify's own fault (the judge's
        process, a copy of a timed output), is evaluated again alone: what its neighbours held never decides it."""
        shared = device_options.sharing is not None and not device_options.sharing.alone
        try:
            verdict = evaluate_unit(unit, device_options, sink.store, sink.lock)
        except InfrastructureError as error:
            if not (shared and "out of memory" in str(error).lower()):
                raise
            return _alone(unit, device_options, sink)
        if shared and ran_out_of_memory(verdict.status.value, verdict.message):
            return _alone(unit, device_options, sink)
        return verdict

    def _admitted(self, unit: Unit, device_options: CheckOptions) -> CheckOptions:
        """The unit's options with its memory admission on its device's ledger, where the device has one."""
        ledger = self.ledgers.get(device_options.device)
        if ledger is None or device_options.sharing is None:
            return device_options
        admission = Admission(ledger, unit.key, self.needs.get(unit.key))
        return dataclasses.replace(device_options,
                                   sharing=dataclasses.replace(device_options.sharing, admission=admission))

    def _evaluate_from(self, ready: queue.Queue, device: str, sink: Sink) -> None:
        device_options = dataclasses.replace(self.options, device=device, sharing=self.sharing.get(device))
        while not sink.stopped:
            unit = ready.get()
            if unit is None:
                return
            started = time.monotonic()
            try:
                verdict = self._evaluate_once_more_alone(unit, self._admitted(unit, device_options), sink)
            except InfrastructureError as error:
                sink.error(unit, str(error))
                continue
            except BaseException as error:  # a bug of ours: stop every thread and raise it in the caller
                sink.failure(error)
                return
            sink.verdict(unit, verdict, time.monotonic() - started, device)


def _alone(unit, device_options: CheckOptions, sink: "Sink") -> Verdict:
    log.info("%s [%s] ran out of memory beside other units: evaluated again alone", unit.entry.entry_id,
             unit.protocol.name)
    alone = dataclasses.replace(device_options.sharing, alone=True)
    return evaluate_unit(unit, dataclasses.replace(device_options, sharing=alone), sink.store, sink.lock)


def rescore(entries: list[Entry], protocols: list[Protocol], store: Store, *, run_id: str, devices: list[str],
            options: CheckOptions, progress: Callable[[Progress], None] | None = None,
            build_workers: int | None = None, arguments: dict | None = None, executor=None,
            share: int = 1) -> RescoreSummary:
    """Every planned unit not yet in `store`, run by `executor`: by default a `LocalExecutor` on `devices`, `share`
    units side by side per device; any object with `workers`, `provenance(device)` (the machine the run is for)
    and `run(units, sink)` will do, e.g. `kbverify.rescore.ray_executor.RayExecutor` (and `session()`, a context the run
    happens in, if it has one). `build_workers` caps the local executor's parallel builds."""
    started = time.monotonic()
    units = plan_units(entries, protocols)
    if progress:  # before the machine is probed for provenance: that can take seconds on a GPU host
        progress(Progress(0, len(units), phase="start", device=devices[0], workers=len(devices) * share,
                          devices=len(devices) if executor is None else None))
    if executor is None:
        plan = default_build_plan(len(devices) * share)
        if build_workers:
            plan = dataclasses.replace(plan, parallel_builds=min(plan.parallel_builds, build_workers))
        executor = LocalExecutor(devices, options, plan, share)
    session = getattr(executor, "session", contextlib.nullcontext)
    with session():
        sink = _run_units(executor, units, store, run_id, devices, progress, arguments)
    if sink.failures:
        # Finished units are in the store; a rerun resumes after the fix.
        raise sink.failures[0]
    return RescoreSummary(units=len(units), evaluated=sink.done, resumed=sink.resumed, errors=tuple(sink.errors),
                          wall_s=time.monotonic() - started)


def _run_units(executor, units: list[Unit], store: Store, run_id: str, devices: list[str],
               progress: Callable[[Progress], None] | None, arguments: dict | None) -> Sink:
    # The plan goes with the run, so `score` and `report` of the store can tell which units have no verdict.
    planned = {unit.key: planned_unit(unit) for unit in units}
    provenance = executor.provenance(devices[0])
    store.begin_run(run_id, provenance, {**(arguments or {}), "planned_units": planned},
                    allow_mixed=bool((arguments or {}).get("allow_mixed")))
    todo = [unit for unit in units if not store.has(unit.key)]
    resumed = len(units) - len(todo)
    for unit in [u for u in todo if not u.entry.verifiable]:
        store.put(unit.key, run_id, unverifiable_verdict(unit.entry, unit.protocol))
    todo = [u for u in todo if u.entry.verifiable]
    sink = Sink(store, run_id, todo, resumed, progress, executor.workers, devices[0],
                provenance_module.compat_key(provenance),
                devices=len(devices) if isinstance(executor, LocalExecutor) else None)
    executor.run(todo, sink)
    return sink


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
