"""Which compute processes hold the timing GPU, and whether any of them is not kbverify's own (SPEC §7: before
timing on a GPU, no foreign compute process may hold it). The parent's side: nvidia-smi as a subprocess, never
torch.

Ours are told from foreign ones by ancestry: every process kbverify starts (the worker server, its supervisors, a
sandbox's init and job) descends from this process, and a confined job, however deep its own PID namespace, also
has a number in ours, with its parent's number as we see it. So the host PIDs of our workers are this process's
descendants in /proc, a set no submission can add to or take from (it sees only its own namespace).

nvidia-smi names processes by the driver's numbers, which are this namespace's unless kbverify itself runs in a
container with a PID namespace of its own; there a number names nothing here and is counted as foreign, which is
right at the moments this is asked: right before a timing worker starts and right after the last one ended, when
no worker of this verdict holds the device.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess

from kbverify.harness import mps_lifetime

log = logging.getLogger(__name__)

APPS_QUERY = ["nvidia-smi", "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader"]
GPU_QUERY = ["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"]
QUERY_TIMEOUT_S = 20.0
FOREIGN = "foreign_gpu_process"  # kbverify.core.status.Warn.FOREIGN_GPU_PROCESS
UNCHECKED = "gpu_processes_unchecked"  # kbverify.core.status.Warn.GPU_PROCESSES_UNCHECKED
_NONE_FOUND = re.compile(r"^no running (compute )?processes found\.?$", re.IGNORECASE)
_MEMORY = re.compile(r"^(\d+)\s*MiB$")


class _Unreadable(Exception):
    """nvidia-smi is there but said nothing this module can read with confidence."""


def check(device: str, when: str, *, ours_env: dict | None = None) -> dict:
    """One look at the device: `{"when", "checked": True, "gpu_uuid", "ours": [pid], "foreign": [{pid, used_mib,
    command}]}`, or `{"when", "checked": False, "reason"}` where it could not be asked or answered unreadably
    (never a silent pass). `ours_env`: a process whose environment holds all of these is ours too: the run's
    private MPS server (`kbverify.harness.mps`), which the daemon starts outside our process tree, with the daemon's
    environment and so its private pipe folder, which no other process on the machine is given. Any process marked as
    this command's MPS daemon's (kbverify.harness.mps_lifetime) is ours too."""
    if not device.startswith("cuda"):
        return {"when": when, "checked": False, "reason": f"the device is {device}, not a GPU"}
    if shutil.which("nvidia-smi") is None:
        return {"when": when, "checked": False, "reason": "nvidia-smi is not on PATH"}
    try:
        uuid = _device_uuid(device)
        apps = _apps(_ask(APPS_QUERY))
    except _Unreadable as error:
        log.warning("could not tell which processes hold %s: %s", device, error)
        return {"when": when, "checked": False, "reason": str(error)}
    ours_all = descendants(os.getpid())
    own_daemon = {mps_lifetime.OWNER_VAR: mps_lifetime.owner_token()}  # this command's MPS daemon and servers
    ours, foreign = [], []
    for pid, used_mib, gpu_uuid in apps:
        if gpu_uuid != uuid:
            continue
        if pid in ours_all or (ours_env and _has_env(pid, ours_env)) or _has_env(pid, own_daemon):
            ours.append(pid)
        else:
            foreign.append({"pid": pid, "used_mib": used_mib, "command": _command(pid)})
    if foreign:
        log.warning("%s is held by %d process(es) not kbverify's own: %s", device, len(foreign),
                    ", ".join(f"pid {p['pid']} ({p['command'] or 'not visible here'})" for p in foreign))
    return {"when": when, "checked": True, "gpu_uuid": uuid, "ours": sorted(ours), "foreign": foreign}


def warnings_for(records: list[dict], device: str) -> list[str]:
    """`foreign_gpu_process` where any look found one; `gpu_processes_unchecked` where a GPU's timing went
    unchecked (a CPU has nothing to check: its records say so, without a warning)."""
    warnings = []
    if any(r.get("checked") and r.get("foreign") for r in records):
        warnings.append(FOREIGN)
    if device.startswith("cuda") and (not records or any(not r.get("checked") for r in records)):
        warnings.append(UNCHECKED)
    return warnings


def _ask(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise _Unreadable(f"nvidia-smi did not answer within {QUERY_TIMEOUT_S:.0f} s") from None
    except (OSError, ValueError) as error:
        raise _Unreadable(f"nvidia-smi could not run: {error}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise _Unreadable(f"nvidia-smi failed (exit {done.returncode}): {(said or [''])[-1][:200]}")
    return done.stdout


def _apps(text: str) -> list[tuple[int, int | None, str]]:
    apps = []
    for line in text.splitlines():
        line = line.strip()
        if not line or _NONE_FOUND.match(line):
            continue
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].startswith(("GPU-", "MIG-")):
            raise _Unreadable(f"nvidia-smi's process list has a line this cannot read: {line[:120]!r}")
        memory = _MEMORY.match(parts[1])
        apps.append((int(parts[0]), int(memory[1]) if memory else None, parts[2]))
    return apps


def _device_uuid(device: str) -> str:
    """The UUID of the GPU `cuda:N` names, through the visible list the workers get (kbverify.harness.sandbox): an index
    there is nvidia-smi's index (the same order as CUDA's on a machine of one GPU model), a UUID is itself."""
    _, _, index = device.partition(":")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [entry.strip() for entry in visible.split(",")] if visible else None
    position = int(index or 0)
    entry = entries[position] if entries and position < len(entries) else str(position)
    if entry.startswith("MIG-"):
        raise _Unreadable(f"{device} is a MIG instance ({entry}); nvidia-smi lists processes by whole GPU")
    gpus = []
    for line in _ask(GPU_QUERY).splitlines():
        if line.strip():
            parts = [part.strip() for part in line.split(",")]
            if len(parts) != 2 or not parts[0].isdigit() or not parts[1].startswith("GPU-"):
                raise _Unreadable(f"nvidia-smi's GPU list has a line this cannot read: {line.strip()[:120]!r}")
            gpus.append((parts[0], parts[1]))
    matches = [uuid for number, uuid in gpus if (uuid.startswith(entry) if entry.startswith("GPU-")
                                                  else number == entry)]
    if len(matches) != 1:
        raise _Unreadable(f"nvidia-smi lists no single GPU for {device} (visible as {entry!r})")
    return matches[0]


def descendants(root: int) -> set[int]:
    """`root` and every process below it, by the parent numbers in this namespace's /proc."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {root}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone since the listing
        children.setdefault(int(fields[1]), []).append(int(name))
    found, frontier = {root}, [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


def _has_env(pid: int, wanted: dict) -> bool:
    """`pid`'s environment holds every pair of `wanted` (False where it cannot be read: another user's process)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            pairs = handle.read().split(b"\0")
    except OSError:
        return False
    found = {pair.decode(errors="replace") for pair in pairs}
    return all(f"{key}={value}" in found for key, value in wanted.items())


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read(200).replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
