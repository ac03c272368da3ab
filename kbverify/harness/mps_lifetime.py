"""kbverify's MPS daemon lives no longer than the command that started it, whatever ends the command.

`nvidia-cuda-mps-control -d` daemonises: the daemon and the servers it starts are nobody's children of ours, so no
death signal of the kernel's and no unwinding reaches them (a SIGKILL unwinds nothing). Three rules:

- Every process of the daemon carries OWNER_VAR=<the command's pid>:<its start time> in its environment (the
  daemon's servers inherit the daemon's environment). That marks it as this run's (kbverify.harness.gpu_processes: ours,
  never foreign) and, once that command is gone, as a leftover.
- A watchdog (`python -m kbverify.harness.mps_lifetime CONTROL`) is started, in a session of its own, before the daemon. It
  reads its stdin until end-of-file, which comes when the command is gone, however it died. Unless the command said
  `done` first (it quit the daemon itself), it tells the daemon to quit and kills what still carries the mark.
- At start (`end_stale`), a marked process whose command is gone is ended the same way, or reported in one line.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

OWNER_VAR = "KBVERIFY_MPS_OWNER"
QUIT_TIMEOUT_S = 10.0
GONE_WITHIN_S = 3.0


def process_start_time(pid: int) -> str | None:
    """A process's start time in clock ticks (field 22 of /proc/PID/stat), None if it is gone or a zombie: with
    its pid, what names one process however pids are reused."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def owner_token(pid: int | None = None) -> str:
    """`pid:start time` of this process (or `pid`): a number alone may be another process's by the next run."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{process_start_time(pid)}"


def _owner_alive(token: str) -> bool:
    pid, _, started = token.partition(":")
    return pid.isdigit() and process_start_time(int(pid)) == started


def _environ(pid: int) -> dict[str, str]:
    try:
        pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(pair.decode(errors="replace").split("=", 1) for pair in pairs if b"=" in pair)


def marked(token: str | None = None) -> dict[int, dict[str, str]]:
    """Live processes carrying the mark (of `token`, or of any owner), with their environments; never this one."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        environ = _environ(int(name))
        owner = environ.get(OWNER_VAR)
        if owner and (token is None or owner == token) and process_start_time(int(name)) is not None:
            found[int(name)] = environ
    return found


class Watchdog:
    """The watchdog of one daemon (see the module's rules); `stand_down` once the daemon was told to quit."""

    def __init__(self, control: str, env: dict):
        package_root = str(Path(__file__).resolve().parents[2])  # importable wherever the command runs from
        path = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        self.process = subprocess.Popen([sys.executable, "-m", "kbverify.harness.mps_lifetime", control],
                                        env={**env, "PYTHONPATH": path},
                                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True, cwd="/")

    def stand_down(self, quit_done: bool = True) -> None:
        """The command ends the watch; unless `quit_done`, the watchdog still ends the daemon (kills what is left)."""
        try:
            self.process.stdin.write(b"done\n" if quit_done else b"")
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=QUIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()


def end_daemon(control: str, env: dict, token: str) -> list[int]:
    """Tell the daemon of `env`'s pipe folder to quit, then kill whatever still carries `token`'s mark. Returns the
    processes that would not go."""
    try:
        subprocess.run([control], env=env, input=b"quit\n", capture_output=True, timeout=QUIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        pass
    deadline = time.monotonic() + GONE_WITHIN_S
    while marked(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in marked(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.1)
    return sorted(marked(token))


def end_stale(control: str = "nvidia-cuda-mps-control") -> list[str]:
    """End the MPS daemons (and their servers and watchdogs) that earlier kbverify commands left: marked processes
    whose command is gone. Returns one line per daemon that would not go (also logged as a warning)."""
    owners: dict[str, dict] = {}
    for pid, environ in marked().items():
        if not _owner_alive(environ[OWNER_VAR]):
            owners.setdefault(environ[OWNER_VAR], environ)
    lines = []
    for token, environ in owners.items():
        left = end_daemon(control, {**os.environ, **environ}, token)
        log.info("ended the MPS daemon an earlier kbverify run (pid %s) left", token.split(":")[0])
        if left:
            pipe = environ.get("CUDA_MPS_PIPE_DIRECTORY", "?")
            lines.append(f"an MPS daemon left by an earlier kbverify run (pid {token.split(':')[0]}) could not be "
                         f"ended (processes {', '.join(map(str, left))}): run `echo quit | "
                         f"CUDA_MPS_PIPE_DIRECTORY={pipe} {control}` as its owner")
            log.warning("%s", lines[-1])
    return lines


def main() -> None:
    """The watchdog: waits for its stdin to end; unless told `done`, ends the daemon of its environment."""
    for signum in (signal.SIGINT, signal.SIGHUP):  # a terminal's signals are for the command, not for this
        signal.signal(signum, signal.SIG_IGN)
    said = sys.stdin.buffer.read()
    if b"done" not in said:
        end_daemon(sys.argv[1], dict(os.environ), os.environ[OWNER_VAR])


if __name__ == "__main__":
    main()
