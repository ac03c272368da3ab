"""A private CUDA Multi-Process Service (MPS) daemon for audit copies that share one GPU.

Without MPS, the processes on a GPU take turns. Each copy's kernels run alone in its time slice, so a copy whose
kernels are small leaves most of the SMs idle while nvidia-smi reads the GPU as busy. Under MPS the copies' kernels
run side by side. Only throughput changes: every kernel computes what it computes without MPS.

The daemon is this run's own. Its pipe and log folders are private (CUDA_MPS_PIPE_DIRECTORY and
CUDA_MPS_LOG_DIRECTORY, set only in the environment given to the copies), so no other process on the machine
connects to it, and it is told to quit when the copies are done, or, however the command ends, by its watchdog
(kbverify.harness.mps_lifetime), which also ends a daemon an earlier command left. The GPU's compute mode and settings are
not touched. Where the control program is missing, or a probe process does not end up on an MPS server, the copies
run as before and the state says why.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kbverify.harness import mps_lifetime

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
# One CUDA context and one kernel: a client connects to the daemon at its first CUDA call.
DEFAULT_PROBE = (sys.executable, "-c",
                 "import torch; torch.zeros(1, device='cuda').add_(1); torch.cuda.synchronize()")
CONTROL_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class MpsState:
    used: bool
    reason: str  # why not, or which server runs
    env: dict[str, str] = field(default_factory=dict)  # to add to the copies' environment; empty when unused

    def describe(self) -> str:
        return f"MPS: {'on' if self.used else 'off'} ({self.reason})"


@contextmanager
def private_mps(folder: Path, *, probe: Sequence[str] | None = None, control: str = CONTROL) -> Iterator[MpsState]:
    """A private MPS daemon for the duration of the block, or a state saying why there is none."""
    binary = shutil.which(control)
    if binary is None:
        yield MpsState(False, f"no {control} on PATH")
        return
    folder = Path(folder).resolve()
    extra = {"CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(folder / "log")}
    for path in extra.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    mps_lifetime.end_stale(binary)
    env = {**os.environ, **extra, mps_lifetime.OWNER_VAR: mps_lifetime.owner_token()}
    watchdog = mps_lifetime.Watchdog(binary, env)  # before the daemon: no moment where it could be left
    started = _run([binary, "-d"], env, CONTROL_TIMEOUT_S)
    if started.returncode != 0:
        watchdog.stand_down()
        yield MpsState(False, f"{control} -d exited {started.returncode}: {_tail(started)}")
        return
    try:
        state = _probe(binary, env, extra, DEFAULT_PROBE if probe is None else probe)
    except BaseException:  # a SIGTERM (`timeout`) while probing: the daemon must not outlive the run
        _quit(binary, env, control, watchdog)
        raise
    log.info("%s", state.describe())
    if not state.used:  # the copies run without it: no daemon left behind
        _quit(binary, env, control, watchdog)
        yield state
        return
    try:
        yield state
    finally:
        _quit(binary, env, control, watchdog)


def _quit(binary: str, env: dict, control: str, watchdog) -> None:
    done = _run([binary], env, CONTROL_TIMEOUT_S, stdin="quit\n")
    if done.returncode != 0:
        log.warning("%s quit exited %d: %s", control, done.returncode, _tail(done))
    watchdog.stand_down(quit_done=done.returncode == 0)


def _probe(binary: str, env: dict, extra: dict, probe: Sequence[str]) -> MpsState:
    """Whether a CUDA process started with `env` runs on this daemon's server (a client that cannot reach the
    daemon runs without MPS, silently: the server list is what shows it connected)."""
    ran = _run(list(probe), env, PROBE_TIMEOUT_S)
    if ran.returncode != 0:
        return MpsState(False, f"the probe process exited {ran.returncode}: {_tail(ran)}")
    servers = _run([binary], env, CONTROL_TIMEOUT_S, stdin="get_server_list\n")
    pids = servers.stdout.split() if servers.returncode == 0 else []
    if pids:
        return MpsState(True, f"private daemon, server pid {', '.join(pids)}", extra)
    # a server may also have come and gone with its one client: the daemon's log says whether it ever started
    started = _server_starts(Path(extra["CUDA_MPS_LOG_DIRECTORY"]) / "control.log")
    if started:
        return MpsState(True, f"private daemon, {started} server start(s) in its log", extra)
    return MpsState(False, f"no MPS server after the probe ({_tail(servers) or 'empty server list'})")


def _server_starts(control_log: Path) -> int:
    try:
        text = control_log.read_text(errors="replace")
    except OSError:
        return 0
    # "Starting new server N for user U" (the daemon's own line; "NEW SERVER N: Ready" follows it)
    return sum("starting new server" in line.lower() for line in text.splitlines())


def _run(command: list[str], env: dict, timeout_s: float, stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, env=env, input=stdin, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as error:
        return subprocess.CompletedProcess(command, 127, "", f"{type(error).__name__}: {error}")


def _tail(done: subprocess.CompletedProcess) -> str:
    text = (done.stderr or done.stdout or "").strip()
    return text[-300:]
