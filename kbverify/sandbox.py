"""Child processes for untrusted work: own process group, hard timeout, bounded output, own temp dir and home.

Children fork from a forkserver that has torch imported but CUDA untouched, so a worker starts in tens of
milliseconds instead of the seconds a fresh interpreter needs to import torch (SPEC §7).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kbverify.errors import InfrastructureError

log = logging.getLogger(__name__)

OUTPUT_HEAD_BYTES = 16 * 1024
PHASE_FILE = "phase"  # in the result folder, beside result.json: never in the child's working directory
OUTPUT_CAP_BYTES = 4 * 1024 * 1024  # the log file is truncated past this; only head and tail are kept
_POLL_S = 0.05

_context = None
_last_worker_info: dict[str, dict] = {}  # device → what the last worker on it reported about itself


def last_worker_info(device: str) -> dict | None:
    return _last_worker_info.get(device)
# Imported once in the forkserver so each child starts warm; none of these touches CUDA at import.
# Measured on torch 2.11+cu130: importing torch.utils.cpp_extension in the server makes CUDA unusable in forked
# children, so it is imported in each child instead.
PRELOAD = ["torch", "numpy", "kbverify.worker", "kbverify.evaluate", "kbverify.timing", "kbverify.kernelbench_v01",
           "kbverify.correctness", "kbverify.hidden", "kbverify.stats"]
# Only the interleaved timing worker needs scipy (its stopping rule's quantiles). Importing it costs about 60% of
# torch's own import (0.5 s on a CPU), which a command that times nothing that way should not pay at start-up;
# a timing worker forked from a server without it imports it itself, before its clock starts.
TIMING_PRELOAD = ["scipy.stats"]


def preload(*, timing: bool) -> list[str]:
    return PRELOAD + (TIMING_PRELOAD if timing else [])


def _forkserver(*, timing: bool = True):
    """The worker server, created and started on first use; `timing` only matters then (what it preloads)."""
    global _context
    if _context is None:
        method = os.environ.get("KBVERIFY_START_METHOD", "forkserver")
        try:
            context = multiprocessing.get_context(method)
            if method == "forkserver":
                context.set_forkserver_preload(preload(timing=timing))
        except ValueError:  # platforms without forkserver
            context = multiprocessing.get_context("spawn")
        _context = context
        if context.get_start_method() == "forkserver":
            _start_server_off_our_output()
    return _context


def _start_server_off_our_output() -> None:
    """Start the server (and multiprocessing's resource tracker) with stdout and stderr on /dev/null. Inheriting
    ours, they would hold a caller's pipes open after kbverify has exited, until their own exit (a process with
    torch loaded takes a while to finish): a caller reading kbverify's output waited ~0.5 s more per command on a
    CPU. Workers write to logs of their own anyway; a server that cannot start shows as workers that cannot."""
    from multiprocessing import forkserver

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):  # closed or replaced streams
            pass
    try:
        saved = [os.dup(1), os.dup(2)]
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:  # our own stdout or stderr is closed: nothing of ours to keep the server off
        saved = []
    try:
        if saved:
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
        forkserver.ensure_running()
    except OSError as error:
        log.warning("could not start the worker server: %s", error)
    finally:
        if saved:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in (*saved, devnull):
                os.close(fd)


def start_early(*, timing: bool = True) -> None:
    """Start the forkserver now, so its torch import overlaps with whatever the parent does next. `timing=False`:
    no interleaved timing will run (see TIMING_PRELOAD)."""
    _forkserver(timing=timing)


@dataclass(frozen=True)
class ChildOutcome:
    result: dict | None  # what the child wrote; None when it died first
    exit_code: int | None
    timed_out: bool
    last_phase: str  # the phase the child announced last ("" if none)
    output_head: str
    output_tail: str
    output_bytes: int  # approximate once output was cut: writes racing the cut go uncounted
    wall_s: float
    start_s: float | None = None  # from asking for the child to having it: the worker server's start-up, if new
    phases_s: tuple = ()  # (kind of phase, seconds the job spent in it), as the child reported; () if it did not
    job_s: float | None = None  # the job itself, from the child's start (after the server's start-up)

    def timeline(self) -> str:
        """Where the wall time went, for logs: `start 4.10 s, job 2.10 s: worker:start 0.31, reference:load 0.90, …`."""
        parts = [] if self.start_s is None else [f"start {self.start_s:.2f} s"]
        if self.job_s is not None:
            parts.append(f"job {self.job_s:.2f} s: " + ", ".join(f"{kind} {s:.2f}" for kind, s in self.phases_s))
        return ", ".join(parts)

    @property
    def died(self) -> bool:
        return self.result is None


def run_child(job: str, payload: dict, *, timeout_s: float, device: str = "cpu",
              env: dict | None = None, keep_dir: bool = False) -> ChildOutcome:
    """Run `kbverify.worker.run_job(job, payload)` in a fresh child and wait for it (or kill it)."""
    return run_children([ChildSpec(job, payload, timeout_s, device, env, keep_dir)])[0]


@dataclass(frozen=True)
class ChildSpec:
    job: str
    payload: dict
    timeout_s: float
    device: str = "cpu"
    env: dict | None = None
    keep_dir: bool = False
    on_exit: object = None  # called with no arguments as soon as this child has ended, however it ended


def run_children(specs: list[ChildSpec]) -> list[ChildOutcome]:
    """Run children side by side (e.g. a candidate and the judge that consumes its outputs) and wait for all."""
    outcomes = _run_together(specs)
    broken = [o for o in outcomes if "forked subprocess" in (o.result or {}).get("infrastructure_error", "")]
    if broken and _context is not None and _context.get_start_method() == "forkserver":
        # Something the server preloaded touched CUDA, so forked children cannot use it: spawn from now on.
        log.warning("CUDA is unusable in forked workers here (%s); falling back to spawned workers",
                    broken[0].result["infrastructure_error"])
        _use_spawn()
        outcomes = _run_together(specs)
    return outcomes


def _use_spawn() -> None:
    global _context
    _context = multiprocessing.get_context("spawn")


class _Running:
    def __init__(self, spec: ChildSpec):
        self.spec = spec
        # Neutral names: nothing in the child's cwd, HOME or TMPDIR says which job it runs; the result goes to a
        # sibling folder that is not the child's working directory.
        self.workdir = Path(tempfile.mkdtemp(prefix="kbv-"))
        self.resultdir = Path(tempfile.mkdtemp(prefix="kbv-"))
        child_env = dict(spec.env or {})
        visible = _visible_devices(spec.device)
        if visible is not None:
            child_env["CUDA_VISIBLE_DEVICES"] = visible
        self.started = time.monotonic()
        try:
            self.process = _forkserver().Process(target=_child_main,
                                                 args=(spec.job, spec.payload, str(self.workdir), child_env,
                                                       str(self.resultdir)),
                                                 daemon=False)
            self.process.start()
            self.start_s = time.monotonic() - self.started
        except OSError as error:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise InfrastructureError(f"cannot start a worker process: {error}") from None
        self.log_path = self.workdir / "output.log"
        self.head, self.dropped = b"", 0
        self.timed_out = False
        self.outcome: ChildOutcome | None = None

    def poll(self) -> bool:
        """True once the child has ended (and its outcome is collected)."""
        if self.outcome is not None:
            return True
        self.head, self.dropped = _bound_log(self.log_path, self.head, self.dropped)
        if self.process.is_alive():
            if time.monotonic() - self.started <= self.spec.timeout_s:
                return False
            self.timed_out = True
        self._collect()
        return True

    def _collect(self) -> None:
        _kill_group(self.process.pid)
        self.process.join(5)
        wall_s = time.monotonic() - self.started
        self.head, self.dropped = _bound_log(self.log_path, self.head, self.dropped)
        tail = _read_tail(self.log_path, self.head)
        result = None if self.timed_out else _read_json(self.resultdir / "result.json")
        if isinstance(result, dict) and isinstance(result.get("_worker"), dict):
            _last_worker_info[self.spec.device] = result.pop("_worker")
        phases = result.pop("_phases_s", None) if isinstance(result, dict) else None
        job_s = result.pop("_job_s", None) if isinstance(result, dict) else None
        # written where the submission ran: numbers only, anything else dropped
        phases_s = tuple((kind, float(seconds)) for kind, seconds in
                         (entry for entry in (phases if isinstance(phases, list) else [])
                          if isinstance(entry, list) and len(entry) == 2)
                         if isinstance(kind, str) and _is_number(seconds))
        job_s = float(job_s) if _is_number(job_s) else None
        phase_file = self.resultdir / PHASE_FILE
        last_phase = phase_file.read_text().strip() if phase_file.exists() else ""
        size = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.outcome = ChildOutcome(result=result, exit_code=self.process.exitcode, timed_out=self.timed_out,
                                    last_phase=last_phase, output_head=self.head.decode(errors="replace"),
                                    output_tail=tail, output_bytes=self.dropped + size, wall_s=wall_s,
                                    start_s=self.start_s, phases_s=phases_s, job_s=job_s)
        shutil.rmtree(self.resultdir, ignore_errors=True)
        if not self.spec.keep_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if callable(self.spec.on_exit):
            self.spec.on_exit()


def _run_together(specs: list[ChildSpec]) -> list[ChildOutcome]:
    running = []
    try:
        for spec in specs:
            running.append(_Running(spec))
        while True:
            ended = [child.poll() for child in running]  # every child, each time: output bounds and timeouts
            if all(ended):
                break
            # woken at once when a child ends (its sentinel), else every _POLL_S; a child already collected is not
            # waited on, since its sentinel stays ready and would make this a busy loop
            multiprocessing.connection.wait([child.process.sentinel for child in running if child.outcome is None],
                                            timeout=_POLL_S)
    finally:
        for child in running:
            if child.outcome is None:
                child.timed_out = True
                child._collect()
    return [child.outcome for child in running]


def _visible_devices(device: str) -> str | None:
    """The child sees exactly one GPU (its cuda:0), named through the parent's own visible list; "cuda:all"
    leaves the list as it is (for probing how many there are); a CPU child sees none."""
    if not device.startswith("cuda"):
        return ""
    _, _, index = device.partition(":")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if index == "all":
        return visible
    physical = visible.split(",") if visible else None
    position = int(index or 0)
    return physical[position] if physical and position < len(physical) else str(position)


def _kill_group(pid: int | None) -> None:
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _bound_log(path: Path, head: bytes, dropped: int) -> tuple[bytes, int]:
    """Keep the first OUTPUT_HEAD_BYTES forever and let the file grow to the cap, then cut it (O_APPEND)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return head, dropped
    if len(head) < OUTPUT_HEAD_BYTES and size > len(head):
        with open(path, "rb") as handle:
            head = handle.read(OUTPUT_HEAD_BYTES)
    if size > OUTPUT_CAP_BYTES:
        os.truncate(path, 0)
        dropped += size
    return head, dropped


def _read_tail(path: Path, head: bytes, limit: int = OUTPUT_HEAD_BYTES) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            tail = handle.read()
    except FileNotFoundError:
        return ""
    if tail == head[-len(tail):] and len(tail) <= len(head):
        return ""
    return tail.decode(errors="replace")


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _child_main(job: str, payload: dict, workdir: str, env: dict, resultdir: str) -> None:
    """Runs in the child: isolate, redirect output, run the job, write the result atomically, exit hard."""
    parent = os.getppid()
    os.setsid()
    _die_with_parent(parent)
    fd = os.open(os.path.join(workdir, "output.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for sub in ("home", "tmp"):
        os.makedirs(os.path.join(workdir, sub), exist_ok=True)
    os.environ.update(env)
    os.environ["HOME"] = os.path.join(workdir, "home")
    os.environ["TMPDIR"] = os.path.join(workdir, "tmp")
    tempfile.tempdir = None
    os.chdir(workdir)
    from kbverify import guards, worker

    if not job.startswith("kernelbench"):  # KernelBench's own protocol runs submissions as KernelBench did
        guards.install_tripwires()

    code = 0
    try:
        result = worker.run_job(job, payload, phase_file=os.path.join(resultdir, PHASE_FILE))
    except BaseException as error:  # an infrastructure failure inside our own worker code
        result = {"infrastructure_error": f"{type(error).__name__}: {error}"}
        code = 70
    tmp = os.path.join(resultdir, "result.json.tmp")
    with open(tmp, "w") as handle:
        json.dump(result, handle, default=_json_default)
    os.replace(tmp, os.path.join(resultdir, "result.json"))
    # os._exit: leaked threads or atexit hooks of the submission must not keep the child alive.
    os._exit(code)


def _die_with_parent(parent: int) -> None:
    """A new session escapes the caller's process group, so a killed kbverify would leave its workers running
    with no one to enforce their timeouts: ask the kernel to kill this child when its parent (the server) dies."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(70)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _json_default(value):
    if isinstance(value, float):
        return None
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
