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
import re
import zlib
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
# The private temporary folders and /dev/shm are memory (tmpfs): each is bounded, so a job that fills them fails
# with ENOSPC (its own failure) instead of taking the machine's memory. Bytes with k/m/g, or a share of RAM ("5%").
TMPFS_SIZE_ENV = "KBVERIFY_TMPFS_SIZE"
TMPFS_DEFAULT_CAP = 2 << 30  # the default: this, or an eighth of the machine's memory where that is less
TMPFS_INODES = 262144  # each file costs kernel memory that `size` does not count
_TMPFS_SIZE = re.compile(r"^(?:[1-9]\d*[kmgKMG]?|[1-9]\d?%)$")

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
    writable: tuple = ()  # the host folders the job may write (given to its own uid before it runs)
    uid: int | None = None  # the unprivileged uid the job runs as (None: it keeps this process's)


def switched_off() -> bool:
    """Read by the parent when it starts a worker (the worker server's environment is fixed when it starts)."""
    return os.environ.get(DISABLE_ENV, "").lower() in ("off", "0", "no")


def tmpfs_size() -> str:
    """The size= of each private tmpfs, from KBVERIFY_TMPFS_SIZE or the default; read by the parent when it starts
    a worker. ValueError names the variable and what it accepts."""
    given = os.environ.get(TMPFS_SIZE_ENV, "").strip()
    if not given:
        try:
            memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            memory = 8 * TMPFS_DEFAULT_CAP
        return str(max(64 << 20, min(TMPFS_DEFAULT_CAP, memory // 8)))
    if not _TMPFS_SIZE.match(given):
        raise ValueError(f"{TMPFS_SIZE_ENV}={given!r}: give a size in bytes with an optional k, m or g (512m, 2g) "
                         "or a share of the machine's memory below 100% (5%)")
    return given


SANDBOX_UID_BASE = 200000  # the jobs' uids lie above this: no file, key or process of anyone else's
# The variables naming a submission's own build and compiler-cache folders (runner.build_env keys them by its
# content hash): the only folders outside its scratch that its jobs may write.
BUILD_FOLDERS = ("TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def sandbox_uid(env: dict) -> int:
    """The uid a job runs as. Jobs of one submission share its build folders and may run at once (its `original`
    and `verified` units side by side, a build beside an evaluation): they share one uid, the folders' owner, or
    the second to start would take the folders from the first and leave it unable to write its own files. Their
    own pid, IPC and network namespaces and a read-only view of everything else keep them apart otherwise; a
    job of no submission's folders gets a uid of its supervisor's."""
    folders = "\0".join(env.get(name, "") for name in BUILD_FOLDERS)
    key = zlib.crc32(folders.encode()) if folders.strip("\0") else os.getpid()
    return SANDBOX_UID_BASE + key % 100000


def enter(writable: list[str], stage: str, *, off: bool = False, tmpfs: str = "", scratch: str = "",
          run_as: int | None = None) -> Confinement:
    """In the supervisor, before it forks: new namespaces and the mount view its next child will have. `stage` is
    an empty folder of the parent's on which the private temporary folders are built; `writable` the host folders
    that stay writable (at their own paths); `tmpfs` the size= of each private tmpfs; `scratch` the one of them
    (the job's cwd, HOME and TMPDIR) that becomes a private tmpfs of that size instead of the host's folder, so
    that what the job writes there cannot fill the host's disk; `run_as` the uid to run as (sandbox_uid). Returns how
    far it got; never half-applies a view without saying so."""
    if off:
        return Confinement("degraded", f"switched off by {DISABLE_ENV}=off")
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET
    user = os.geteuid() != 0
    uid, gid = os.geteuid(), os.getegid()
    try:
        _check(_c().unshare(flags | (CLONE_NEWUSER if user else 0)), "unshare")
    except (OSError, AttributeError) as error:
        return Confinement("degraded", f"namespaces unavailable ({error})")
    writable = sorted({os.path.realpath(p) for p in writable}, key=len)
    try:
        if user:
            _map_user(uid, gid)
        _private_view(writable, stage, needed=[] if user else _needed_to_read(),
                      bound=f"size={tmpfs or tmpfs_size()},nr_inodes={TMPFS_INODES}",
                      scratch=os.path.realpath(scratch) if scratch else "")
    except OSError as error:
        # The namespaces exist but the view could not be built: nothing confines the job, so say so.
        return Confinement("degraded", f"mount view failed ({error})", new_pid_namespace=True)
    kinds = "user, " if user else ""
    reason = f"{kinds}pid, mount, ipc and network namespaces; read-only filesystem"
    job_uid = None
    if not user:
        blocked = _devices_closed_to_others()
        if blocked:
            reason += f"; kept uid 0 ({blocked} is not open to other users)"
        else:
            job_uid = run_as if run_as is not None else SANDBOX_UID_BASE + os.getpid() % 100000
            reason += "; its own uid"
    return Confinement("isolated", reason, new_pid_namespace=True, writable=tuple(writable), uid=job_uid)


def _map_user(uid: int, gid: int) -> None:
    with open("/proc/self/setgroups", "w") as handle:
        handle.write("deny")
    with open("/proc/self/uid_map", "w") as handle:
        handle.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as handle:
        handle.write(f"0 {gid} 1")


def _private_roots() -> list[str]:
    """Folders every job gets empty and its own: the shared temporary folders (the parent's own among them, which
    hold the worker server's socket) and /dev/shm."""
    import tempfile

    roots = {PRIVATE_TMP, "/var/tmp", os.path.realpath(tempfile.gettempdir())}
    return sorted((r for r in roots if os.path.isdir(r)), key=len)


def _needed_to_read() -> list[str]:
    """What the job reads to run at all: the interpreter, its libraries, this package."""
    import sys

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    return sorted(os.path.realpath(p) for p in paths)


def _private_view(writable: list[str], stage: str, *, needed: list[str], bound: str, scratch: str = "") -> None:
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    _mount("tmpfs", stage, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755," + bound)  # the private temporary folders
    _open_blocked_ancestors(needed, stage, through=writable)
    roots = _private_roots()
    for index, _ in enumerate(roots):
        os.makedirs(os.path.join(stage, f"root{index}"))
        os.chmod(os.path.join(stage, f"root{index}"), 0o1777)  # as a temporary folder is: anyone's, sticky
    binds = []
    for path in writable:
        root = next((r for r in reversed(roots) if path == r or path.startswith(r + "/")), None)
        target = path if root is None else os.path.join(stage, f"root{roots.index(root)}") + path[len(root):]
        os.makedirs(target, exist_ok=True)
        if path == scratch:
            _scratch_on_tmpfs(target, bound)
        else:
            _mount(path, target, None, _MS_BIND | _MS_REC)
            # what a job writes there must not become a way up: no setuid files, no device nodes
            _mount(None, target, None, _MS_BIND | _MS_REMOUNT | _MS_NOSUID | _MS_NODEV)
        binds.append(target)
    _read_only_everything([stage, *binds])
    # the root that holds the stage goes last: once covered, the stage is out of reach by its path
    for index, root in sorted(enumerate(roots), key=lambda item: stage.startswith(item[1] + "/")):
        _mount(os.path.join(stage, f"root{index}"), root, None, _MS_BIND | _MS_REC)
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777," + bound)


def _scratch_on_tmpfs(target: str, bound: str) -> None:
    """The job's scratch (cwd, HOME, TMPDIR: gettempdir) as a bounded tmpfs with the folders the job expects: a
    job that fills it fails with ENOSPC, its own failure, and the host's disk stays as it was."""
    _mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755," + bound)
    for sub in ("home", "tmp"):
        os.makedirs(os.path.join(target, sub), exist_ok=True)


def _open_blocked_ancestors(paths: list[str], stage: str, *, through: list[str] = ()) -> None:
    """A job of its own uid cannot pass a folder closed to others (root's home, 0700, holding a Python or the
    build cache): such a folder is covered by an empty one open to all, and only the entries on the way to
    what the job needs to read are bound back in, as they are (read-only once the view is done). A folder it
    writes (`through`: its build folders) is bound back by itself, not the branch it lies in: binding back
    that branch (all of ~/.cache) showed every other submission's builds to the job."""
    blocked: dict[str, set[str]] = {}
    for path in [*paths, *through]:
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts)):
            ancestor = "/" + "/".join(parts[:depth])
            try:
                closed = not os.stat(ancestor).st_mode & 0o001
            except OSError:
                break
            if closed and not any(ancestor.startswith(b + "/") for b in blocked):
                entry = parts[depth] if path in paths else "/".join(parts[depth:])
                blocked.setdefault(ancestor, set()).add(entry)
                break
    keep = os.path.join(stage, "kept")
    for number, (ancestor, entries) in enumerate(sorted(blocked.items())):
        held = []
        for index, entry in enumerate(sorted(entries)):  # a whole child before any folder deep inside it
            source = os.path.join(ancestor, entry)
            if not os.path.isdir(source):
                continue
            kept = os.path.join(keep, str(number), str(index))
            os.makedirs(kept)
            _mount(source, kept, None, _MS_BIND | _MS_REC)
            held.append((entry, kept))
        _mount("tmpfs", ancestor, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
        for entry, kept in held:
            os.makedirs(os.path.join(ancestor, entry), exist_ok=True)
            _mount(kept, os.path.join(ancestor, entry), None, _MS_BIND | _MS_REC)


def _devices_closed_to_others() -> str:
    """The first GPU device node another uid could not open ("" if none): then the job keeps uid 0."""
    import glob
    import stat as stat_module

    for node in sorted(glob.glob("/dev/nvidia*")):
        try:
            mode = os.stat(node).st_mode
        except OSError:
            continue
        if stat_module.S_ISCHR(mode) and mode & 0o006 != 0o006:
            return node
    return ""


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
    """In the namespace's first process: die with the supervisor, and a /proc that shows this namespace alone,
    with the kernel's settings in it read-only (uid 0 may write /proc/sys without any capability)."""
    die_with_parent()
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    for path in ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs"):
        if os.path.exists(path):
            _mount(path, path, None, _MS_BIND | _MS_REC)
            _mount(None, path, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)


def drop_privileges(confinement: Confinement) -> None:
    """In the job, the last step before any submission code: its writable folders given to its own uid, that
    uid taken, and no capability left in any set, none regained by an exec (the bounding set is empty and
    no_new_privs is set), so the mounts above cannot be undone and nothing of root's is its to use."""
    libc = _c()
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for capability in range(_last_capability() + 1):
        libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0)
    if confinement.uid is not None:
        for path in confinement.writable:
            _give(path, confinement.uid)
        os.setgroups([])
        os.setresgid(confinement.uid, confinement.uid, confinement.uid)
        os.setresuid(confinement.uid, confinement.uid, confinement.uid)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = Header(_CAP_VERSION_3, 0), (Data * 2)()
    _check(libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")


def _give(root: str, uid: int) -> None:
    """chown -R, links left as they are (lchown): the job owns what it may write, and nothing else."""
    for folder, dirs, files in os.walk(root):
        for name in [folder, *(os.path.join(folder, entry) for entry in dirs + files)]:
            try:
                os.lchown(name, uid, uid)
            except OSError:
                pass


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
