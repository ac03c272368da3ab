"""The sandbox around a process that runs submission code (SPEC §4, §7; shared/reference/isolation.md).

Linux namespaces, entered by the worker's supervisor before it forks the process that runs the job:
- PID: the job sees only its own namespace (its init and its own descendants), so it cannot name, signal or trace
  the parent, the judge or any other worker, and every process it starts dies with the namespace's init;
- mount: every mount read-only, `/tmp` and `/dev/shm` private and empty, `/proc` showing the namespace alone;
  writable only the folders the parent names (the worker's scratch, the submission's own build root, the
  hand-over folder of its outputs);
- IPC and network: no System V objects or abstract sockets shared with anyone, no network;
- user (where kbverify does not run as root): what lets an unprivileged user create the others.
After that the job drops every capability and sets no_new_privs, so it can neither undo the mounts nor gain
privileges through an exec. Nothing here is imported by the parent for any reason but its names.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 1, 24, 38, 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_VERSION_3 = 0x20080522
PRIVATE_TMP = "/tmp"
DISABLE_ENV = "KBVERIFY_SANDBOX"  # "off": run submission code unconfined, and every verdict says so

_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda text: text.encode() if text is not None else None  # noqa: E731
    _check(_c().mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)),
           f"mount {target}")


@dataclass(frozen=True)
class Confinement:
    isolation: str  # "isolated" or "degraded"
    reason: str = ""  # why degraded, or which namespaces were entered
    new_pid_namespace: bool = False


def enter(writable: list[str], stage: str) -> Confinement:
    """In the supervisor, before it forks: new namespaces and the mount view its next child will have. `stage` is
    an empty folder of the parent's on which the private /tmp is built; `writable` the host folders that stay
    writable (at their own paths). Returns how far it got; never half-applies a view without saying so."""
    if os.environ.get(DISABLE_ENV, "").lower() in ("off", "0", "no"):
        return Confinement("degraded", f"switched off by {DISABLE_ENV}")
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET
    user = os.geteuid() != 0
    uid, gid = os.geteuid(), os.getegid()
    try:
        _check(_c().unshare(flags | (CLONE_NEWUSER if user else 0)), "unshare")
    except (OSError, AttributeError) as error:
        return Confinement("degraded", f"namespaces unavailable ({error})")
    try:
        if user:
            _map_user(uid, gid)
        _private_view(writable, stage)
    except OSError as error:
        # The namespaces exist but the view could not be built: nothing confines the job, so say so.
        return Confinement("degraded", f"mount view failed ({error})", new_pid_namespace=True)
    kinds = "user, " if user else ""
    return Confinement("isolated", f"{kinds}pid, mount, ipc and network namespaces; read-only filesystem",
                       new_pid_namespace=True)


def _map_user(uid: int, gid: int) -> None:
    with open("/proc/self/setgroups", "w") as handle:
        handle.write("deny")
    with open("/proc/self/uid_map", "w") as handle:
        handle.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as handle:
        handle.write(f"0 {gid} 1")


def _private_view(writable: list[str], stage: str) -> None:
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    _mount("tmpfs", stage, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
    keep_writable = [stage]
    for path in sorted({os.path.realpath(p) for p in writable}, key=len):
        inside_tmp = path == PRIVATE_TMP or path.startswith(PRIVATE_TMP + "/")
        target = stage + path[len(PRIVATE_TMP):] if inside_tmp else path
        os.makedirs(target, exist_ok=True)
        _mount(path, target, None, _MS_BIND | _MS_REC)
        if not inside_tmp:
            keep_writable.append(target)
    _read_only_everything(keep_writable)
    _mount(stage, PRIVATE_TMP, None, _MS_BIND | _MS_REC)
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")


def _read_only_everything(keep: list[str]) -> None:
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4].replace("\\040", " ") for line in handle]
    for point in points:
        if point.startswith("/proc") or any(point == k or point.startswith(k + "/") for k in keep):
            continue
        try:
            status = os.statvfs(point)
        except OSError:
            continue  # a mount this namespace cannot reach is no way out either
        kept = ((_MS_NOSUID if status.f_flag & os.ST_NOSUID else 0) | (_MS_NODEV if status.f_flag & os.ST_NODEV else 0)
                | (_MS_NOEXEC if status.f_flag & os.ST_NOEXEC else 0))
        if status.f_flag & os.ST_RDONLY:
            continue
        _mount(None, point, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | kept)


def become_init() -> None:
    """In the namespace's first process: die with the supervisor, and a /proc that shows this namespace alone."""
    die_with_parent()
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)


def drop_privileges() -> None:
    """In the job, the last step before any submission code: no capability left in any set, none regained by an
    exec (the bounding set is empty and no_new_privs is set), so the mounts above cannot be undone."""
    libc = _c()
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for capability in range(_last_capability() + 1):
        libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = Header(_CAP_VERSION_3, 0), (Data * 2)()
    _check(libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")


def _last_capability() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 63


def die_with_parent() -> None:
    """The kernel kills this process when the one that forked it ends (whatever killed that one)."""
    import signal

    try:
        _c().prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
