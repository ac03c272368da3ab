"""The sandbox around a process that runs submission code (SPEC §4, §7; shared/reference/isolation.md).

Linux namespaces, entered by the worker's supervisor before it forks the process that runs the job:
- PID: the job sees only its own namespace (its init and its own descendants), so it cannot name, signal or trace
  the parent, the judge or any other worker, and every process it starts dies with the namespace's init;
- mount: every mount read-only, `/tmp` and `/dev/shm` private and empty, `/proc` showing the namespace alone;
  writable only the folders the parent names (the worker's scratch, the submission's own build root, the
  hand-over folder of its outputs). What the interpreter reads that lies under a private folder (a venv or a
  checkout under /tmp) is bound back read-only at its own path, and the folders the job writes are made there,
  whatever the parent's TMPDIR; a view that cannot be built runs no job (the command exits 3, naming the path);
- IPC and network: no System V objects or abstract sockets shared with anyone, no network;
- user (where kbverify does not run as root): what lets an unprivileged user create the others.
After that the job drops every capability and sets no_new_privs, so it can neither undo the mounts nor gain
privileges through an exec. Nothing here is imported by the parent for any reason but its names.
"""

from __future__ import annotations

import contextlib
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
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")
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
    isolation: str  # "isolated", "degraded" or "failed" (see `failed`)
    reason: str = ""  # why degraded, or which namespaces were entered
    new_pid_namespace: bool = False
    writable: tuple = ()  # the host folders the job may write (given to its own uid before it runs)
    uid: int | None = None  # the unprivileged uid the job runs as (None: it keeps this process's)
    failed: str = ""  # the view could not be built: one line naming the path and what to do; no job may run


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
    that what the job writes there cannot fill the host's disk; `run_as` the uid to run as (sandbox_uid).

    Returns how far it got: "isolated"; "degraded" where the machine allows no namespaces (or the sandbox is
    switched off); "failed" where the namespaces exist but the view could not be built, with `failed` a line naming
    the path and what to do: the supervisor then runs no job and the command exits 3 (a half-built view must never
    produce a verdict: an honest kernel read `crashed`, with the submission unconfined)."""
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
            with _step("cannot map this user into its own namespace (/proc/self/uid_map)", _ALLOW_NAMESPACES):
                _map_user(uid, gid)
        _private_view(writable, stage, needed=_needed_to_read(), open_blocked=not user,
                      bound=f"size={tmpfs or tmpfs_size()},nr_inodes={TMPFS_INODES}",
                      scratch=os.path.realpath(scratch) if scratch else "")
    except Unbuilt as error:
        # The namespaces exist but the view is not (or only half) built: no job may run in it.
        return Confinement("failed", str(error), new_pid_namespace=True, failed=str(error))
    except Exception as error:  # noqa: BLE001 - a bug of ours is as fatal as a mount that failed
        reason = f"building it failed ({type(error).__name__}: {error}); {_SWITCH_OFF}".replace("\n", " ")
        return Confinement("failed", reason, new_pid_namespace=True, failed=reason)
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


_SWITCH_OFF = f"or set {DISABLE_ENV}=off to run submissions unconfined (every verdict then says isolation: degraded)"
_ALLOW_NAMESPACES = ("run kbverify as root, or allow unprivileged user namespaces and mounts in them (sysctl "
                     "user.max_user_namespaces; on Ubuntu, kernel.apparmor_restrict_unprivileged_userns=0)")


class Unbuilt(Exception):
    """The job's view could not be built. Its text is one line: what failed, on which path, and what to do."""


@contextlib.contextmanager
def _step(what: str, todo: str):
    try:
        yield
    except OSError as error:
        cause = os.strerror(error.errno) if error.errno else str(error)
        raise Unbuilt(f"{what}: {cause}; {todo}, {_SWITCH_OFF}".replace("\n", " ")) from None


def _private_roots() -> list[str]:
    """Folders every job gets empty and its own: the shared temporary folders (the parent's own among them, which
    hold the worker server's socket). One that lies below another (TMPDIR=/tmp/ci/tmp, as CI runners, pytest and
    `mktemp -d` give) is no root of its own: it is made inside the private copy of the one above it. As a root of
    its own it was mounted after that copy had hidden it, the mount failed, and the job ran in a half-built view."""
    import tempfile

    roots = {os.path.realpath(r) for r in (PRIVATE_TMP, "/var/tmp", tempfile.gettempdir())}
    roots = {r for r in roots if r != "/" and os.path.isdir(r)}
    return sorted((r for r in roots if not any(r.startswith(other + "/") for other in roots)), key=len)


def _root_of(path: str, roots: list[str]) -> str | None:
    """The private root that `path` lies strictly below, if any."""
    return next((root for root in roots if path.startswith(root + "/")), None)


def _needed_to_read() -> list[str]:
    """What the job reads to run at all, wherever it lies: the interpreter and its prefixes (a venv's and the
    Python it was made from), site-packages, every sys.path entry, this package and the folder it was found in,
    the CUDA toolkit a build uses. Each as given and as its real path (a venv's python links into another prefix)."""
    import site
    import sys

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, getattr(sys, "base_exec_prefix", sys.exec_prefix),
             os.path.dirname(os.path.abspath(sys.executable)), os.path.dirname(os.path.realpath(sys.executable)),
             package, os.path.dirname(package), os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", "")}
    try:
        paths.update(site.getsitepackages())
        paths.add(site.getusersitepackages())
    except (AttributeError, TypeError):  # an embedded or frozen interpreter's site module
        pass
    paths.update(p for p in sys.path if isinstance(p, str))
    found = set()
    for path in paths:
        if path and os.path.isabs(path) and os.path.exists(path):
            found.update((os.path.normpath(path), os.path.realpath(path)))
    return sorted(found)


def _private_view(writable: list[str], stage: str, *, needed: list[str], bound: str, scratch: str = "",
                  open_blocked: bool = False) -> None:
    """Build the job's view (see the module's docstring); raises Unbuilt naming the path where it could not.
    `open_blocked`: the job will run as a uid of its own, which must be let through folders closed to others."""
    stage = os.path.realpath(stage)
    with _step("the job's namespace cannot make its mounts its own (/)", _ALLOW_NAMESPACES):
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    with _step(f"cannot mount the job's private temporary folders on {stage}",
               "give TMPDIR an existing folder on a local filesystem"):
        _mount("tmpfs", stage, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755," + bound)  # the private temporary folders
    roots = _private_roots()
    copies = {root: os.path.join(stage, f"root{index}") for index, root in enumerate(roots)}

    def in_view(path: str) -> str:  # where a host path is made in the view being built
        root = next((r for r in reversed(roots) if path == r or path.startswith(r + "/")), None)
        return path if root is None else copies[root] + path[len(root):]

    if open_blocked:
        _open_blocked_ancestors(sorted({os.path.realpath(p) for p in needed if _root_of(p, roots) is None}),
                                os.path.join(stage, "kept"),
                                through=[w for w in writable if _root_of(w, roots) is None and w not in roots])
    for copy in copies.values():
        os.makedirs(copy)
        os.chmod(copy, 0o1777)  # as a temporary folder is: anyone's, sticky
    bound_back = _bind_back(needed, roots, copies)
    if open_blocked:  # the same inside the private copies: a closed folder within what was bound back
        _open_blocked_ancestors([in_view(p) for p in bound_back], os.path.join(stage, "kept-private"),
                                through=[in_view(w) for w in writable if _root_of(w, roots) is not None],
                                below=tuple(copies.values()))
    binds = []
    for path in writable:
        target = in_view(path)
        with _step(f"cannot bind the job's writable folder {path} into its view",
                   "check that it is a folder on a local filesystem"):
            _make_dirs(target)
            if path == scratch:
                _scratch_on_tmpfs(target, bound)
            else:
                _mount(path, target, None, _MS_BIND | _MS_REC)
                # what a job writes there must not become a way up: no setuid files, no device nodes
                _mount(None, target, None, _MS_BIND | _MS_REMOUNT | _MS_NOSUID | _MS_NODEV)
        binds.append(target)
    _read_only_everything([stage, *binds])
    # the root that holds the stage goes last: once covered, the stage is out of reach by its path
    for root in sorted(roots, key=lambda r: stage.startswith(r + "/")):
        with _step(f"cannot give the job a private {root}", f"check that {root} is a folder on a local filesystem"):
            _mount(copies[root], root, None, _MS_BIND | _MS_REC)
    if os.path.isdir("/dev/shm"):
        with _step("cannot give the job a private /dev/shm", "check that /dev/shm is a folder"):
            _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777," + bound)


def _make_dirs(path: str, mode: int = 0o755) -> None:
    """os.makedirs, with every folder it creates open to the job (whatever this process's umask)."""
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for folder in reversed(missing):
        os.mkdir(folder)
        os.chmod(folder, mode)


def _bind_back(needed: list[str], roots: list[str], copies: dict) -> list[str]:
    """Everything the interpreter reads that lies below a private root (a venv or checkout under /tmp, a
    `pip install --target /tmp/site`), bound back read-only at its own path in that root's private copy: the
    job's /tmp stays its own and empty but for these. A path that is a root itself is not bound back (that
    would be the host's whole /tmp). Returns the needed paths that lie below a root."""
    below = sorted((p for p in needed if _root_of(p, roots) is not None), key=len)
    bound: list[str] = []
    for path in below:
        if any(path.startswith(b + "/") for b in bound):
            continue
        root = _root_of(path, roots)
        with _step(f"cannot bind {path} (the interpreter reads it) back into the job's private {root}",
                   f"install Python and kbverify outside {root}"):
            if _bind_back_one(path, root, copies[root]):
                bound.append(path)
    return below


def _bind_back_one(path: str, root: str, copy: str) -> bool:
    """Make `path` (below `root`) in `copy`: its folders, a link as the link it is (what it points to is bound
    back by its real path), and the path itself bound read-only. False where a link stood in the way."""
    host, view = root, copy
    parts = path[len(root) + 1:].split("/")
    for index, part in enumerate(parts):
        host, view = os.path.join(host, part), os.path.join(view, part)
        if os.path.islink(host):
            if not os.path.lexists(view):
                os.symlink(os.readlink(host), view)
            return False
        if index < len(parts) - 1:
            _make_dirs(view)
    if os.path.isdir(host):
        _make_dirs(view)
    elif not os.path.lexists(view):
        os.close(os.open(view, os.O_WRONLY | os.O_CREAT, 0o644))  # a zip on sys.path: a file bound on a file
    _mount(host, view, None, _MS_BIND | _MS_REC)
    for point in _mount_points():
        if point == view or point.startswith(view + "/"):
            _read_only(point)
    return True


def _scratch_on_tmpfs(target: str, bound: str) -> None:
    """The job's scratch (cwd, HOME, TMPDIR: gettempdir) as a bounded tmpfs with the folders the job expects: a
    job that fills it fails with ENOSPC, its own failure, and the host's disk stays as it was."""
    _mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755," + bound)
    for sub in ("home", "tmp"):
        os.makedirs(os.path.join(target, sub), exist_ok=True)


def _open_blocked_ancestors(paths: list[str], keep: str, *, through: list[str] = (),
                            below: tuple = ("",)) -> None:
    """A job of its own uid cannot pass a folder closed to others (root's home, 0700, holding a Python or the
    build cache): such a folder is covered by an empty one open to all, and only the entries on the way to
    what the job needs to read are bound back in, as they are (read-only once the view is done). A folder it
    writes (`through`: its build folders) is bound back by itself, not the branch it lies in: binding back
    that branch (all of ~/.cache) showed every other submission's builds to the job. Only folders below one of
    `below` are looked at (the private copies of /tmp: the host's folders above them are not the job's way);
    `keep` is an unused folder of the stage where the entries are held meanwhile."""
    blocked: dict[str, set[str]] = {}
    for path in [*paths, *through]:
        base = next((b for b in below if path.startswith(b + "/")), None)
        if base is None:
            continue
        parts = path[len(base):].strip("/").split("/")
        for depth in range(1, len(parts)):
            ancestor = base + "/" + "/".join(parts[:depth])
            try:
                closed = not os.stat(ancestor).st_mode & 0o001
            except OSError:
                break
            if closed and not any(ancestor.startswith(b + "/") for b in blocked):
                entry = parts[depth] if path in paths else "/".join(parts[depth:])
                blocked.setdefault(ancestor, set()).add(entry)
                break
    for number, (ancestor, entries) in enumerate(sorted(blocked.items())):
        with _step(f"cannot let the job through {ancestor}, which is closed to other users",
                   f"open {ancestor} to others (chmod o+x) or install Python, kbverify and its cache elsewhere"):
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
            _mount(None, ancestor, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


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


def _mount_points() -> list[str]:
    """Every mount point of this namespace, unescaped (mountinfo writes a space, tab, newline or backslash in a
    path as \\040, \\011, \\012, \\134: a folder named so was otherwise never found, and left writable)."""
    with open("/proc/self/mountinfo") as handle:
        return [_OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), line.split()[4]) for line in handle]


def _read_only(point: str) -> None:
    """Remount `point` read-only, keeping the flags it has (a user namespace may not drop them)."""
    try:
        status = os.statvfs(point)
    except OSError:
        return  # a mount this namespace cannot reach is no way out either
    if status.f_flag & os.ST_RDONLY:
        return
    kept = ((_MS_NOSUID if status.f_flag & os.ST_NOSUID else 0) | (_MS_NODEV if status.f_flag & os.ST_NODEV else 0)
            | (_MS_NOEXEC if status.f_flag & os.ST_NOEXEC else 0))
    _mount(None, point, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | kept)


def _read_only_everything(keep: list[str]) -> None:
    for point in _mount_points():
        if point.startswith("/proc") or any(point == k or point.startswith(k + "/") for k in keep):
            continue
        with _step(f"cannot make {point} read-only in the job's view",
                   "report this with the output of `cat /proc/self/mountinfo`"):
            _read_only(point)


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
