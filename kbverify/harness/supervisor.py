"""The child side of a worker, outside the job: the supervisor, the namespace's init, and the job's start.

    parent ──socket──▶ supervisor (forked by the worker server; runs no submission code)
                         └─ init: PID 1 of a new PID namespace (confined jobs; runs no submission code)
                              └─ job: drops every capability, then runs kbverify.worker.worker.run_job

The supervisor relays the job's framed messages to the parent, tagged so the job cannot speak in its name, and
reports what only it can know: how the job was confined and how it ended (waitpid). It watches the parent's
lifeline: when every copy of its write end is gone (the parent died, however it died) it kills the job, and with
the namespace's init everything the job started. Nothing here imports torch; the job imports it (preloaded).
"""

from __future__ import annotations

import json
import os
import signal
import select
import tempfile
import time

from kbverify.harness import channel, confine

SUPERVISOR_TAG = b"S"
JOB_TAG = b"J"
READY = "sandbox:ready"  # the init's first frame, written before any submission code exists in the namespace
_RELAY_DRAIN_S = 5.0
_POLL_S = 0.05


def child_main(job: str, payload: dict, workdir: str, log_path: str, env: dict, writable: list[str], stage: str,
               parent, lifeline, confine_off: bool = False, tmpfs_size: str = "") -> None:
    """The worker server's child: confine, fork the job, relay, report its end, exit."""
    os.setsid()
    confine.die_with_parent()  # against the worker server
    _let_the_server_go()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for sub in ("home", "tmp"):
        os.makedirs(os.path.join(workdir, sub), exist_ok=True)
    confined = channel.runs_submission(job, payload)
    confinement = (confine.enter([workdir, *writable], stage, off=confine_off, tmpfs=tmpfs_size, scratch=workdir,
                                 run_as=confine.sandbox_uid(env))
                   if confined else confine.Confinement("none", "runs no submission code"))
    if confinement.failed:  # a half-built view: no job runs in it, and the parent raises an infrastructure error
        _tell(parent, channel.EXIT, code=None, signal=None, sandbox_failed=confinement.failed)
        os._exit(0)
    up_r, up_w = os.pipe()
    down_r, down_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _close_all_but({0, 1, 2, up_w, down_r})
        if confinement.new_pid_namespace:
            _init_main(job, payload, workdir, env, up_w, down_r, confinement)
        _job_main(job, payload, workdir, env, up_w, down_r, confinement)
    os.close(up_w)
    os.close(down_r)
    if confinement.new_pid_namespace and not _init_ready(up_r):
        os.waitpid(pid, 0)
        _tell(parent, channel.EXIT, code=None, signal=None, sandbox_failed="the sandbox's init did not start")
        os._exit(0)
    _tell(parent, channel.SANDBOX, isolation=confinement.isolation, reason=confinement.reason, job_pid=pid)
    status = _relay(pid, up_r, down_w, parent, lifeline)
    if not confinement.new_pid_namespace:
        _kill_group(pid)  # what the job started in its own group; a confined job's died with its namespace
    code = os.waitstatus_to_exitcode(status)
    if confinement.new_pid_namespace and code >= 128:  # the init passes a killed job's signal on as 128 + N
        code = -(code - 128)
    _tell(parent, channel.EXIT, code=code if code >= 0 else None, signal=-code if code < 0 else None)
    os._exit(0)


def _tell(parent, kind: str, **fields) -> None:
    try:
        parent.send_bytes(SUPERVISOR_TAG + json.dumps({"kind": kind, **fields}).encode())
    except OSError:
        pass


def _relay(pid: int, up_r: int, down_w: int, parent, lifeline) -> int:
    """One thread (a process that has entered a new PID namespace cannot start threads): the job's frames up,
    the parent's commands down, the lifeline watched, until the job has ended and its pipe is drained. Reads
    never block on a frame the job leaves unfinished. Returns the job's wait status."""
    os.set_blocking(up_r, False)
    pending = b""
    status = None
    drain_until = None
    sources = [up_r, parent.fileno(), lifeline.fileno()]
    while True:
        ready, _, _ = select.select(sources, [], [], _POLL_S)
        if lifeline.fileno() in ready:
            _end_everything(pid)
        if parent.fileno() in ready:
            try:
                _write_all(down_w, channel.frame(parent.recv_bytes(channel.MAX_MESSAGE_BYTES)))
            except (EOFError, OSError):
                sources.remove(parent.fileno())
        if up_r in ready:
            chunk = _read_some(up_r)
            if chunk is None:
                sources.remove(up_r)
            else:
                pending = _forward_frames(pending + chunk, parent)
        if status is None:
            reaped, wait_status = os.waitpid(pid, os.WNOHANG)
            if reaped:
                status, drain_until = wait_status, time.monotonic() + _RELAY_DRAIN_S
        if status is not None and (up_r not in sources or time.monotonic() > drain_until):
            return status


def _read_some(fd: int) -> bytes | None:
    try:
        chunk = os.read(fd, 1 << 20)
    except BlockingIOError:
        return b""
    except OSError:
        return None
    return chunk or None


def _forward_frames(data: bytes, parent) -> bytes:
    """Send every complete frame in data on; keep the rest. A frame over the limit ends the relay's trust in
    the stream: everything after it is dropped."""
    size = channel.HEADER_BYTES
    while len(data) >= size:
        length = int.from_bytes(data[:size], "big")
        if length > channel.MAX_MESSAGE_BYTES:
            return b""
        if len(data) < size + length:
            break
        try:
            parent.send_bytes(JOB_TAG + data[size:size + length])
        except OSError:
            pass
        data = data[size + length:]
    return data


def _end_everything(pid: int) -> None:
    """The parent is gone: the job (and, confined, its namespace with the init) dies with it, then this."""
    _kill_group(pid)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    os._exit(0)


def _let_the_server_go() -> None:
    """Every child of multiprocessing's worker server inherits the write end of the server's "alive" pipe, so the
    server outlives the parent while any child lives, and a child outlives it while the server lives: a killed
    kbverify left both running. Closing it here lets the server end with the parent, and this child with it; the
    same for the resource tracker, which ends when its pipe has no writer left."""
    from multiprocessing import forkserver, resource_tracker

    _close_attribute(getattr(forkserver, "_forkserver", None), "_forkserver_alive_fd")
    _close_attribute(getattr(resource_tracker, "_resource_tracker", None), "_fd")


def _close_attribute(holder, name: str) -> None:
    fd = getattr(holder, name, None)
    if isinstance(fd, int):
        try:
            os.close(fd)
        except OSError:
            pass
        setattr(holder, name, None)


def _close_all_but(keep: set[int]) -> None:
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _init_ready(up_r: int) -> bool:
    body = channel.read_frame(up_r)
    message = channel.decode(body) if body is not None else None
    return bool(message) and message.get("phase") == READY


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _init_main(job, payload, workdir, env, up_w, down_r, confinement) -> None:
    """PID 1 of the namespace: when it exits, the kernel kills every process left in it."""
    try:
        confine.become_init()
    except OSError:
        os._exit(71)  # no READY frame: the supervisor reports a sandbox that did not start
    channel.write_message(up_w, {"kind": channel.PHASE, "phase": READY})
    pid = os.fork()
    if pid == 0:
        _job_main(job, payload, workdir, env, up_w, down_r, confinement)
    os.close(up_w)
    os.close(down_r)
    while True:
        try:
            reaped, status = os.wait()
        except ChildProcessError:
            os._exit(70)
        if reaped == pid:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)


def _job_main(job, payload, workdir, env, up_w, down_r, confinement) -> None:
    confine.die_with_parent()
    if not confinement.new_pid_namespace:
        os.setpgid(0, 0)  # its own group, which the supervisor kills when it ends
    os.environ.update(env)
    os.environ["HOME"] = os.path.join(workdir, "home")
    os.environ["TMPDIR"] = os.path.join(workdir, "tmp")
    tempfile.tempdir = None
    os.chdir(workdir)
    if confinement.isolation == "isolated":
        try:
            confine.drop_privileges(confinement)
        except OSError:
            os._exit(71)
    from kbverify.worker import guards, worker

    worker.attach_channel(up_w, down_r)
    if not job.startswith("kernelbench"):  # KernelBench's own protocol runs submissions as KernelBench did
        guards.install_tripwires()
    try:
        result = worker.run_job(job, payload)
    except BaseException as error:  # an infrastructure failure inside our own worker code
        result = {"infrastructure_error": f"{type(error).__name__}: {error}"}
    worker.send({"kind": channel.RESULT, "result": result})
    # os._exit: leaked threads or atexit hooks of the submission must not keep the job alive.
    os._exit(0)
