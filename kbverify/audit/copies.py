"""Copies of `kbverify audit` sharing one task list over the GPUs of one host.

With `--gpus N --per-gpu K`, N·K copies (`OUT.shardI.*`) each take the next task no other copy has claimed, so one
slow task does not hold back a fixed share of the others; their partial files are then merged into
`OUT.partial.jsonl`. Memory decides what runs together: the copies take tasks largest need first
(`kbverify.audit.memory`), and a copy starts a task only when the needs in flight on its GPU plus this one fit the
budget (`kbverify.audit.admission`); one that does not fit now is deferred and tried again, first, whenever the
copy is free. The copies on a GPU share it through a private MPS daemon (`kbverify.harness.mps`), so their kernels run
side by side instead of taking turns; without one they take turns, and the reason is logged.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import kbverify
from kbverify.audit.admission import MemoryLedger
from kbverify.audit.options import AuditOptions
from kbverify.audit.partial import finished_keys, merge_partials, raw_path
from kbverify.core.protocols import parse_protocols
from kbverify.core.tasks import Task
from kbverify.harness.mps import MpsState, private_mps

log = logging.getLogger(__name__)

NEEDS_FILE = "needs.json"  # in the claims folder: each task's estimated need and the budget, for every copy


def shard_files(prefix: Path) -> list[Path]:
    """Every copy's partial file under `prefix`, also those an earlier invocation with more copies left."""
    return sorted(prefix.parent.glob(f"{glob.escape(prefix.name)}.shard*.partial.jsonl"))


def elsewhere(options: AuditOptions) -> set[str]:
    """Tasks whose results an earlier invocation left in another copy's partial file or in the merged one."""
    prefix = Path(str(options.out_prefix).rsplit(".shard", 1)[0])
    paths = [Path(f"{prefix}.partial.jsonl"), Path(f"{prefix}.raw.jsonl"), *shard_files(prefix)]
    return finished_keys([p for p in paths if p != options.partial], protocols=parse_protocols(options.protocol),
                         device=options.device, settings=options.settings())


def claimer(folder: Path, done_elsewhere: set[str], ledger: MemoryLedger | None = None,
            needs: dict[str, int | None] | None = None) -> Callable[[Task], bool | None]:
    """A task belongs to the first copy that creates its claim file: creation with O_EXCL is atomic. With a
    `ledger`, the copy first reserves the task's need (`needs`, by key; a missing one is unknown): claim(task) is
    None while it does not fit (ask again later), and a lost race gives the reservation back."""
    folder.mkdir(parents=True, exist_ok=True)

    def claim(task: Task) -> bool | None:
        if task.key in done_elsewhere:
            return False
        path = folder / hashlib.sha256(task.key.encode()).hexdigest()[:32]
        if path.exists():
            return False
        if ledger is not None and not ledger.try_reserve(task.key, (needs or {}).get(task.key)):
            return None
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            if ledger is not None:
                ledger.release(task.key)
            return False
        return True

    return claim


def copy_claims(options: AuditOptions, tasks: Sequence[Task]):
    """For a copy: its tasks in the order to take them, and its claim and release callbacks."""
    needs = _read_needs(options.claims)
    tasks = largest_first(tasks, needs)
    ledger = _ledger(options.claims, options.device, needs.get("budget_bytes"))
    claim = claimer(options.claims, elsewhere(options), ledger, needs.get("needs", {}))
    release = (lambda task: ledger.release(task.key)) if ledger else None
    return tasks, claim, release


def largest_first(tasks: Sequence[Task], needs: dict) -> list[Task]:
    """Long heavy tasks start early and small ones fill the gaps; an unknown need counts as the largest."""
    by_key = needs.get("needs", {})

    def need(task: Task) -> float:
        value = by_key.get(task.key, 0)  # a task not estimated (no needs at all) keeps its place
        return math.inf if value is None else value

    return sorted(tasks, key=need, reverse=True)  # stable: equal needs keep the task order


def _read_needs(claims: Path) -> dict:
    try:
        return json.loads((claims / NEEDS_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _ledger(claims: Path, device: str, budget: int | None) -> MemoryLedger | None:
    """The copies on one GPU share one ledger; copies on other GPUs have their own."""
    if not budget:
        return None
    return MemoryLedger(claims / f"memory-{device.replace(':', '')}", budget)


@contextlib.contextmanager
def sharing(options: AuditOptions) -> Iterator[MpsState]:
    """A private MPS daemon for the copies with --mps on a CUDA device; a SIGTERM (`timeout`) unwinds through it,
    so the daemon is told to quit even when the run is cut."""
    if not (options.mps and options.on_cuda):
        yield MpsState(False, "--no-mps" if not options.mps else f"device {options.device}")
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    # A short private folder: the daemon's sockets must fit a Unix socket path (108 bytes), which a deep
    # OUT prefix may not. Its log is kept beside the results.
    folder = Path(tempfile.mkdtemp(prefix="kbv-mps-"))
    try:
        with private_mps(folder) as state:
            yield state
    finally:
        signal.signal(signal.SIGTERM, previous)
        control_log = folder / "log" / "control.log"
        if control_log.exists():
            shutil.copyfile(control_log, f"{options.out_prefix}.mps-control.log")
        shutil.rmtree(folder, ignore_errors=True)


def _terminated(signum, frame):
    raise SystemExit(128 + signum)


def run_shards(options: AuditOptions, per_gpu: int, *, fresh: bool, needs: dict | None = None,
               env: dict | None = None) -> None:
    """`per_gpu` copies of `kbverify audit` per GPU sharing one task list; their partial files merged into ours."""
    shards = options.gpus * per_gpu
    # Fresh claims for every invocation: a task claimed by a copy killed before it finished is free again.
    claims = Path(f"{options.out_prefix}.claims-{os.getpid()}-{time.time_ns()}")
    claims.mkdir(parents=True)
    (claims / NEEDS_FILE).write_text(json.dumps(needs or {}))
    if fresh:
        for stale in [options.partial, raw_path(options.partial), *shard_files(options.out_prefix)]:
            stale.unlink(missing_ok=True)
    processes = [subprocess.Popen(_copy_command(options, index, shards, claims), env=_copy_environment(env))
                 for index in range(shards)]
    try:
        codes = [process.wait() for process in processes]
    except BaseException:
        # this command was told to stop: so are its copies, before their MPS daemon (if any) is told to quit
        _stop(processes)
        raise
    log.info("shards finished with exit codes %s", codes)
    options.partial.parent.mkdir(parents=True, exist_ok=True)
    lines = merge_partials(options.partial, shard_files(options.out_prefix), options.fingerprint())
    log.info("merged the copies' results: %d tasks in %s", lines, options.partial)
    shutil.rmtree(claims, ignore_errors=True)


def _copy_command(options: AuditOptions, index: int, shards: int, claims: Path) -> list[str]:
    device = f"cuda:{index % options.gpus}" if options.on_cuda else options.device
    command = [sys.executable, "-m", "kbverify", "audit", str(options.tasks),
               "--out", f"{options.out_prefix}.shard{index}", "--device", device, "--protocol", options.protocol,
               "--seeds", str(options.seeds), "--timeout", str(options.timeout_s),
               "--shard", f"{index}/{shards}", "--claims", str(claims)]
    if options.levels is not None:
        command += ["--levels", ",".join(map(str, options.levels))]
    if options.hidden_tests is not None:
        command += ["--hidden-tests", str(options.hidden_tests)]
    command += ["--no-hidden"] * (not options.hidden_shapes) + ["--verbose"] * options.verbose
    return command


def _copy_environment(extra: dict | None) -> dict:
    """The copies run this very package, wherever it was imported from (a checkout need not be the installed one),
    plus the MPS daemon's variables when there is one."""
    root = str(Path(kbverify.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, **(extra or {}), "PYTHONPATH": path}


def _stop(processes: Sequence[subprocess.Popen], grace_s: float = 10.0) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
