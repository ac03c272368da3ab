"""Child processes for untrusted work, the parent's side: start, watch, time out, collect.

Children fork from a forkserver that has torch imported but CUDA untouched, so a worker starts in tens of
milliseconds instead of the seconds a fresh interpreter needs to import torch (SPEC §7). Each child is a
supervisor (kbverify.harness.supervisor) that confines the job running submission code (kbverify.harness.confine) and relays
its messages over a socket only this process holds; a result counts only from a job that then exited 0.
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
import threading
import time
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from kbverify.core.errors import InfrastructureError, InputError
from kbverify.harness import channel, check_progress, confine, device_share, disk_bound, supervisor
from kbverify.harness.worker_log import bound_log, read_tail

log = logging.getLogger(__name__)

_POLL_S = 0.05

_context = None

# Imported once in the forkserver so each child starts warm; none of these touches CUDA at import.
# Measured on torch 2.11+cu130: importing torch.utils.cpp_extension in the server makes CUDA unusable in forked
# children, so it is imported in each child instead.
PRELOAD = ["torch", "numpy", "kbverify.worker.worker", "kbverify.worker.evaluate", "kbverify.worker.timing", "kbverify.worker.kernelbench_v01",
           "kbverify.judge.correctness", "kbverify.shapes.hidden", "kbverify.core.stats"]
# Only the interleaved timing worker needs scipy (its stopping rule's quantiles). Importing it costs about 60% of
# torch's own import (0.5 s on a CPU), which a command that times nothing that way should not pay at start-up;
# a timing worker forked from a server without it imports it itself, before its clock starts.
TIMING_PRELOAD = ["scipy.stats"]


def preload(*, timing: bool) -> list[str]:
    return PRELOAD + (TIMING_PRELOAD if timing else [])


WORKER_NAME = "kbverify-worker"


def _without_the_callers_main(original):
    """multiprocessing's preparation data for a spawned or forkserver child names the caller's main module, which
    the child imports before its target runs: a script that calls `check` at top level, unguarded by
    `if __name__ == "__main__"`, ran `check` again in every worker, whose start then failed with no output.
    A worker needs nothing of the caller's main (its target and everything it imports live in kbverify), so
    ours start without it; every other process the caller starts is left as multiprocessing makes it."""

    def preparation_data(name):
        data = original(name)
        if name == WORKER_NAME:
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
        return data

    preparation_data.kbverify_wrapped = True
    return preparation_data


_SERVER_LOCK = threading.Lock()


def _forkserver(*, timing: bool = True):
    """The worker server, created and started on first use; `timing` only matters then (what it preloads). Under a
    lock: two threads starting it at once (parallel builds, side-by-side checks) each saved the other's /dev/null
    as their stdout and one restored it, so every later line the caller printed was lost."""
    with _SERVER_LOCK:
        return _forkserver_locked(timing)


def _forkserver_locked(timing: bool):
    global _context
    if _context is None:
        from multiprocessing import spawn

        if not getattr(spawn.get_preparation_data, "kbverify_wrapped", False):
            spawn.get_preparation_data = _without_the_callers_main(spawn.get_preparation_data)
        method = os.environ.get("KBVERIFY_START_METHOD", "forkserver")
        try:
            context = multiprocessing.get_context(method)
            if method == "forkserver":
                context.set_forkserver_preload(preload(timing=timing))
        except ValueError:  # platforms without forkserver
            context = multiprocessing.get_context("spawn")
        _context = context
        if context.get_start_method() == "forkserver":
            _short_socket_folder()
            _start_server_off_our_output()
    return _context


def _short_socket_folder() -> None:
    """The worker server's Unix socket lies in multiprocessing's folder, made under TMPDIR: a socket path holds 107
    bytes, so under a deep TMPDIR no worker started ("AF_UNIX path too long"). Then the folder is made in /tmp."""
    from multiprocessing import util

    if len(tempfile.gettempdir()) <= 60 or not os.access("/tmp", os.W_OK):
        return
    saved, tempfile.tempdir = tempfile.tempdir, "/tmp"
    try:
        util.get_temp_dir()  # made now, and kept by multiprocessing for this process
    finally:
        tempfile.tempdir = saved


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
    result: dict | None  # what the job sent; None when it sent none or did not exit 0 after sending it
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
    isolation: str = "none"  # "isolated", "degraded" (ran submission code unconfined) or "none" (ran none)
    isolation_reason: str = ""
    ran_submission: bool = False  # the job executes submission code: what it says of the machine is unconfirmed
    submission_phase_seen: bool = False  # a candidate phase was announced: from then on every phase is unconfirmed
    trusted_phase: str = ""  # the last phase announced before any candidate phase
    signal: int | None = None  # the signal that killed the job, as the supervisor's waitpid saw it
    sandbox_failed: str = ""  # the sandbox was asked for and could not start: ours, never the candidate's
    stalled_s: float | None = None  # killed for no progress: how long it had said nothing (kbverify.harness.hang)
    stall_allowance_s: float | None = None  # and the budget it had then
    build_dir_over: str = ""  # its build folders took more than their bound and were emptied (kbverify.harness.disk_bound)

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
              env: dict | None = None, keep_dir: bool = False, writable: tuple = ()) -> ChildOutcome:
    """Run `kbverify.worker.worker.run_job(job, payload)` in a fresh child and wait for it (or kill it)."""
    return run_children([ChildSpec(job, payload, timeout_s, device, env, keep_dir, writable=writable)])[0]


@dataclass(frozen=True)
class ChildSpec:
    job: str
    payload: dict
    timeout_s: float
    device: str = "cpu"
    env: dict | None = None
    keep_dir: bool = False
    on_exit: object = None  # called with no arguments as soon as this child has ended, however it ended
    writable: tuple = ()  # host folders the job may write besides its scratch (a confined job sees the rest read-only)
    conversation: object = None  # called as conversation(child) once the child runs: sends commands, reads replies
    hang: object = None  # a kbverify.harness.hang.HangBudget: no progress for longer in a forward phase is a timeout
    pace: object = None  # a kbverify.harness.hang pace that this child's trusted phases inform (kbverify.harness.hang)


def run_children(specs: list[ChildSpec], conversation=None) -> list[ChildOutcome]:
    """Run children side by side (e.g. a candidate and the judge that consumes its outputs) and wait for all.
    `conversation(children)`: one that commands them all in turn (the timing rounds: kbverify.timing.timing_control)."""
    outcomes = _run_together(specs, conversation)
    broken = [o for o in outcomes if "forked subprocess" in (o.result or {}).get("infrastructure_error", "")]
    if broken and _context is not None and _context.get_start_method() == "forkserver":
        # Something the server preloaded touched CUDA, so forked children cannot use it: spawn from now on.
        log.warning("CUDA is unusable in forked workers here (%s); falling back to spawned workers",
                    broken[0].result["infrastructure_error"])
        _use_spawn()
        outcomes = _run_together(specs, conversation)
    for spec, outcome in zip(specs, outcomes):
        if outcome.sandbox_failed:
            # Ours, never the submission's: no verdict may come from a job whose sandbox was not (fully) built.
            raise InfrastructureError(f"the {spec.job} worker's sandbox could not be built: {outcome.sandbox_failed}")
    return outcomes


def _use_spawn() -> None:
    global _context
    _context = multiprocessing.get_context("spawn")


_LIFELINE: list = []  # (read end, write end): only this process ever holds the write end


def _lifeline_reader():
    """The read end every child watches: it reads end-of-file once this process is gone, however it died."""
    if not _LIFELINE:
        _LIFELINE.extend(multiprocessing.Pipe(duplex=False))
    return _LIFELINE[0]


def _writable_from(env: dict, extra: tuple) -> list[str]:
    """The build folders a job writes (the submission's own, keyed by its content hash) and what the caller names."""
    paths = [env[key] for key in confine.BUILD_FOLDERS if env.get(key)]
    paths += [str(p) for p in extra]
    for path in paths:
        os.makedirs(path, exist_ok=True)
    return paths


class _Running:
    def __init__(self, spec: ChildSpec):
        self.spec = spec
        # Neutral names: nothing in the child's cwd, HOME or TMPDIR says which job it runs. The log lives in a
        # folder of the parent's that the job cannot reach (it writes through the descriptor it inherits).
        self.workdir = Path(tempfile.mkdtemp(prefix="kbv-"))
        self.logdir = Path(tempfile.mkdtemp(prefix="kbv-"))
        self.stage = Path(tempfile.mkdtemp(prefix="kbv-"))
        child_env = dict(spec.env or {})
        visible = device_share.visible_devices(spec.device)
        if visible is not None:
            child_env["CUDA_VISIBLE_DEVICES"] = visible
        self.log_path = self.logdir / "output.log"
        self.started = time.monotonic()
        try:
            tmpfs_size = confine.tmpfs_size()
        except ValueError as error:
            self._remove_dirs(keep_workdir=False)
            raise InputError(str(error)) from None
        self.channel, child_end = multiprocessing.Pipe(duplex=True)
        try:
            self.process = _forkserver().Process(
                target=supervisor.child_main,
                args=(spec.job, spec.payload, str(self.workdir), str(self.log_path), child_env,
                      _writable_from(child_env, spec.writable), str(self.stage), child_end, _lifeline_reader(),
                      confine.switched_off(), tmpfs_size),
                name=WORKER_NAME, daemon=False)
            self.process.start()
            self.start_s = time.monotonic() - self.started
            check_progress.child_started(spec.job)
        except OSError as error:
            self._remove_dirs(keep_workdir=False)
            raise InfrastructureError(f"cannot start a worker process: {error}") from None
        finally:
            child_end.close()
        self.head, self.dropped = b"", 0
        self.timed_out = False
        self.outcome: ChildOutcome | None = None
        self.messages = _Messages(channel.runs_submission(spec.job, spec.payload))
        self.closed = False
        self.last_progress = time.monotonic()  # the job's last message, on this process's clock
        self.stalled_s: float | None = None
        self.stall_allowance_s: float | None = None

    def send(self, command: dict) -> None:
        """A command to the job (kbverify.worker.worker.receive_command reads it). Its silence counts from here too:
        a worker that waited for the parent (while another timed its batch) had been asked for nothing."""
        self.channel.send_bytes(json.dumps({"kind": channel.COMMAND, **command}).encode())
        self.last_progress = max(self.last_progress, time.monotonic())

    def read(self, timeout_s: float | None) -> bool:
        """Take in whatever the child has sent within timeout_s; False once the channel is closed."""
        if self.closed:
            return False
        self.head, self.dropped = bound_log(self.log_path, self.head, self.dropped)
        try:
            while self.channel.poll(timeout_s):
                phase = self.messages.last_phase
                if self.messages.take(self.channel.recv_bytes()):
                    self.last_progress = now = time.monotonic()
                    if self.messages.last_phase != phase:
                        check_progress.child_phase(self.spec.job, self.messages.last_phase)
                    if self.spec.pace is not None and not (self.messages.ran_submission
                                                           and self.messages.submission_phase_seen):
                        self.spec.pace.observe(self.messages.last_phase, now)
                timeout_s = 0
        except (EOFError, OSError):
            self.closed = True
        return not self.closed

    def stalled(self, now: float | None = None) -> bool:
        """No progress for longer than the hang budget allows, in a phase where submission code runs forwards
        (kbverify.harness.hang). Judged on this process's clock; the child's word is only that it sent something."""
        hang = self.spec.hang
        if hang is None or not self.messages.ran_submission or self.outcome is not None:
            return False
        self.read(0)  # what has arrived but was not yet read is progress too
        now = time.monotonic() if now is None else now
        quiet = now - self.last_progress
        if not hang.stalled(self.messages.last_phase, quiet, now):
            return False
        if self.stalled_s is None:
            self.stalled_s, self.stall_allowance_s = quiet, hang.allowance_s(now)
        return True

    def stall_text(self) -> str:
        if self.stalled_s is None:
            return ""
        return (f"no progress for {self.stalled_s:.0f} s during {self.messages.last_phase} (hang budget "
                f"{self.stall_allowance_s:.0f} s = {self.spec.hang.describe()})")

    def poll(self) -> bool:
        """True once the child has ended (and its outcome is collected)."""
        if self.outcome is not None:
            return True
        self.read(0)
        self.head, self.dropped = bound_log(self.log_path, self.head, self.dropped)
        if self.process.is_alive():
            if time.monotonic() - self.started <= self.spec.timeout_s and not self.stalled():
                return False
            self.timed_out = True
        else:
            self.read(1.0)  # the supervisor is gone: what it sent last is in the socket, then end-of-file
        self._collect()
        return True

    def _collect(self) -> None:
        # Only a supervisor still running is killed: once reaped, its number (and its group's) may already be
        # another process's, and on a busy machine with 32768 PIDs they come round within the hour.
        if self.process.exitcode is None:
            if self.messages.job_pid is not None and self.messages.isolation != "isolated":
                _kill_group(self.messages.job_pid)  # a confined job's processes die with the namespace's init
            _kill_group(self.process.pid)
        self.process.join(5)
        self.read(0)
        wall_s = time.monotonic() - self.started
        self.head, self.dropped = bound_log(self.log_path, self.head, self.dropped)
        tail = read_tail(self.log_path, self.head)
        size = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.outcome = self.messages.outcome(
            timed_out=self.timed_out, output_head=self.head.decode(errors="replace"), output_tail=tail,
            output_bytes=self.dropped + size, wall_s=wall_s, start_s=self.start_s,
            stalled_s=self.stalled_s, stall_allowance_s=self.stall_allowance_s)
        self.channel.close()
        if self.outcome.ran_submission:
            over = disk_bound.enforce(_writable_from(dict(self.spec.env or {}), ()))
            if over:
                self.outcome = dataclasses.replace(self.outcome, result=None, build_dir_over=over)
        self._remove_dirs(keep_workdir=self.spec.keep_dir)
        if callable(self.spec.on_exit):
            self.spec.on_exit()

    def _remove_dirs(self, *, keep_workdir: bool) -> None:
        shutil.rmtree(self.logdir, ignore_errors=True)
        shutil.rmtree(self.stage, ignore_errors=True)
        if not keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


class _Messages:
    """What a child said, sorted by who said it: the supervisor (trusted) or the job (trusted only until its
    first candidate phase, when submission code starts)."""

    def __init__(self, ran_submission: bool):
        self.ran_submission = ran_submission
        self.result: dict | None = None
        self.last_phase = ""
        self.trusted_phase = ""
        self.submission_phase_seen = False
        self.isolation, self.isolation_reason = "none", ""
        self.job_pid: int | None = None
        self.exit: dict | None = None
        self.replies: list[dict] = []

    def take(self, data: bytes) -> bool:
        """Take in one message; True when it was the job's (progress, for the hang budget)."""
        tag, body = data[:1], data[1:]
        if tag == supervisor.SUPERVISOR_TAG:
            message = json.loads(body)
            if message.get("kind") == channel.SANDBOX:
                self.isolation, self.isolation_reason = message["isolation"], message.get("reason", "")
                self.job_pid = message.get("job_pid")
            elif message.get("kind") == channel.EXIT:
                self.exit = message
            return False
        message = channel.decode(body) if tag == supervisor.JOB_TAG else None
        if message is None or self.exit is not None:
            return False
        if message["kind"] == channel.PHASE and isinstance(message.get("phase"), str):
            self.last_phase = message["phase"][:200]
            if self.last_phase.startswith("candidate"):
                self.submission_phase_seen = True
            if not self.submission_phase_seen:
                self.trusted_phase = self.last_phase
        elif message["kind"] == channel.RESULT and isinstance(message.get("result"), dict):
            self.result = message["result"]
        elif message["kind"] == channel.REPLY:
            self.replies.append(message)
        return True

    def outcome(self, *, timed_out: bool, **fields) -> ChildOutcome:
        exit_code = (self.exit or {}).get("code")
        # A result counts only from a job that exited 0 after sending it, as the supervisor's waitpid saw it.
        result = self.result if (not timed_out and exit_code == 0) else None
        phases = result.pop("_phases_s", None) if isinstance(result, dict) else None
        job_s = result.pop("_job_s", None) if isinstance(result, dict) else None
        # written where the submission ran: numbers only, anything else dropped
        phases_s = tuple((kind, float(seconds)) for kind, seconds in
                         (entry for entry in (phases if isinstance(phases, list) else [])
                          if isinstance(entry, list) and len(entry) == 2)
                         if isinstance(kind, str) and _is_number(seconds))
        return ChildOutcome(result=result, exit_code=exit_code, timed_out=timed_out, last_phase=self.last_phase,
                            phases_s=phases_s, job_s=float(job_s) if _is_number(job_s) else None,
                            isolation=self.isolation, isolation_reason=self.isolation_reason,
                            ran_submission=self.ran_submission, submission_phase_seen=self.submission_phase_seen,
                            trusted_phase=self.trusted_phase, signal=(self.exit or {}).get("signal"),
                            sandbox_failed=(self.exit or {}).get("sandbox_failed", ""), **fields)


def _run_together(specs: list[ChildSpec], conversation=None) -> list[ChildOutcome]:
    running = []
    try:
        for spec in specs:
            running.append(_Running(spec))
        for child in running:
            if callable(child.spec.conversation):
                child.spec.conversation(child)
        if callable(conversation):
            conversation(list(running))
        while True:
            ended = [child.poll() for child in running]  # every child, each time: output bounds and timeouts
            if all(ended):
                break
            # woken at once when a child sends or ends, else every _POLL_S; a child already collected is not
            # waited on, since its sentinel stays ready and would make this a busy loop
            waiting = [c.process.sentinel for c in running if c.outcome is None]
            waiting += [c.channel for c in running if c.outcome is None and not c.closed]
            multiprocessing.connection.wait(waiting, timeout=_POLL_S)
    finally:
        for child in running:
            if child.outcome is None:
                child.timed_out = True
                child._collect()
    return [child.outcome for child in running]


def _kill_group(pid: int | None) -> None:
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
