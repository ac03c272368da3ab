"""Child-side plumbing shared by every job: devices, seeds, loading code, watching native builds.

Everything here runs inside a sandboxed child (kbverify.sandbox); the parent never imports a submission.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import json
import logging
import os
import sys
import threading
import time
import traceback
from pathlib import Path

import torch

from kbverify import channel
from kbverify import tasks as tasks_module

log = logging.getLogger(__name__)

# The job's ends of its channel (kbverify.channel): messages up to the supervisor, commands down from it. Pipes,
# not files: no other process can name them.
_CHANNEL: dict = {"up": None, "down": None}
_LAST_PHASE = [""]  # a list: its contents change during the job, the tamper snapshot keeps its identity
_JOB_STARTED = 0.0
# Seconds this child's job spent in each kind of phase, in order of first appearance: announce() closes the
# running phase and opens the next (a kind is the phase's first two parts, without an input set: "candidate:run:<set>"
# and "judge:<set>" → "candidate:run" and "judge:original").
_PHASE_SECONDS: dict[str, float] = {}
_PHASE_SINCE = [0.0]  # when the last announced phase (or the job, before any) began
_PHASE_KIND = [""]  # the running phase's kind, for the accounts above


def attach_channel(up_fd: int, down_fd: int) -> None:
    _CHANNEL["up"], _CHANNEL["down"] = up_fd, down_fd


def send(message: dict) -> None:
    """A message to the parent (through the supervisor); dropped where the job runs without a channel."""
    if _CHANNEL["up"] is not None:
        channel.write_message(_CHANNEL["up"], message)


def receive_command() -> dict | None:
    """The parent's next command, or None once the parent has closed the channel."""
    if _CHANNEL["down"] is None:
        return None
    body = channel.read_frame(_CHANNEL["down"])
    if body is None:
        return None
    try:
        message = json.loads(body)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def run_job(job: str, payload: dict) -> dict:
    global _JOB_STARTED
    _LAST_PHASE[0] = ""
    _PHASE_KIND[0] = ""
    _JOB_STARTED = time.monotonic()
    _PHASE_SECONDS.clear()
    _PHASE_SINCE[0] = _JOB_STARTED
    torch.set_num_threads(1)
    if str(payload.get("device", "cpu")).startswith("cuda") and job != "probe":
        # Bring CUDA up before any untrusted code runs, so a broken device is our failure, never the kernel's.
        torch.cuda.init()
        torch.zeros(1, device="cuda")
    import importlib

    module_name, _, function = JOBS[job].partition(":")
    if module_name == __name__:
        result = globals()[function](payload)
    else:
        result = getattr(importlib.import_module(module_name), function)(payload)
    if isinstance(result, dict):
        result.update(_time_accounts())
    if isinstance(result, dict) and job != "probe":
        from kbverify.child import guards

        if guards.refused:
            result["refused"] = sorted(set(guards.refused))
        if guards.quietly_refused:
            result["quietly_refused"] = sorted(set(guards.quietly_refused))
    return result


JOBS = {
    "kernelbench_eval": "kbverify.child.kernelbench_v01:eval_job",
    "kernelbench_baseline": "kbverify.child.kernelbench_v01:baseline_job",
    "kernelbench_candidate_timing": "kbverify.child.kernelbench_v01:candidate_timing_job",
    "candidate": "kbverify.child.evaluate:candidate_job",
    "judge": "kbverify.child.evaluate:judge_job",
    "timing": "kbverify.child.timing:timing_job",
    "reference_timing": "kbverify.child.timing:reference_timing_job",
    "timing_check": "kbverify.child.timing_check:timing_check_job",
    "build": "kbverify.child.worker:build_job",
    "audit": "kbverify.child.audit_worker:audit_job",
    "footprint": "kbverify.child.footprint_worker:footprint_job",
    "probe": "kbverify.child.worker:probe_job",
    "hidden": "kbverify.child.worker:hidden_job",
}


def announce(phase: str) -> None:
    """Record what the child is doing, so a crash is attributed to the right party."""
    now = time.monotonic()
    _close_phase(now)
    # Only the party stays in this process (the submission can read it); the phase itself goes to the parent.
    _LAST_PHASE[0] = phase.split(":")[0]
    _PHASE_KIND[0] = phase_kind(phase)
    _PHASE_NOW[0] = phase
    send({"kind": channel.PHASE, "phase": phase})


_PHASE_NOW = [""]  # the whole phase, to announce again after a build inside it


def last_phase() -> str:
    return _LAST_PHASE[0]


def phase_kind(phase: str) -> str:
    return ":".join(phase.split(":")[:2]).split("/")[0] if phase else "worker:start"


def _time_accounts() -> dict:
    """Where this worker's time went, by kind of phase. Taken defensively: the submission runs in this process and
    can reach these globals, and a failure here must not turn its verdict into our infrastructure error."""
    try:
        _close_phase(time.monotonic())
        phases = [[kind, round(seconds, 4)] for kind, seconds in _PHASE_SECONDS.items()
                  if type(kind) is str and type(seconds) is float]
        return {"_phases_s": phases, "_job_s": round(float(time.monotonic() - _JOB_STARTED), 4)}
    except Exception:  # noqa: BLE001 - tampered bookkeeping: no accounts, the verdict stands
        return {}


def _close_phase(now: float) -> None:
    kind = _PHASE_KIND[0] or phase_kind("")
    _PHASE_SECONDS[kind] = _PHASE_SECONDS.get(kind, 0.0) + (now - _PHASE_SINCE[0])
    _PHASE_SINCE[0] = now


def device_from(payload: dict) -> torch.device:
    if payload.get("device", "cpu").startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA requested but not available in the worker")
        return torch.device("cuda", 0)
    return torch.device("cpu")


# Taken when the worker module loads (in the forkserver, before any submission): a submission that rebinds
# torch.manual_seed, torch.default_generator or torch.cuda.manual_seed_all cannot steer the harness's seeds.
_CPU_GENERATOR = torch.default_generator
_CUDA_SEED_ALL = torch.cuda.manual_seed_all
_CUDA_AVAILABLE = torch.cuda.is_available


def set_seed(seed: int) -> None:
    """torch.manual_seed's effect (CPU and every CUDA generator) through generators captured before any
    submission ran, and without torch.manual_seed's per-call wrapper overhead."""
    _CPU_GENERATOR.manual_seed(seed)
    if _CUDA_AVAILABLE():
        _CUDA_SEED_ALL(seed)  # queued by torch until CUDA starts, as torch.manual_seed does


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_device(values, device: torch.device) -> list:
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def task_from(payload: dict) -> tasks_module.Task:
    return tasks_module.parse_task(payload["task_source"], name=payload["task_name"])


def compile_untrusted(source: str, filename: str = "<submission>"):
    """Compile a submission under a unique file name registered with linecache: Triton's @jit reads the kernel's
    source through inspect, which needs it."""
    import hashlib
    import linecache

    name = f"{filename[:-1]}-{hashlib.sha256(source.encode()).hexdigest()[:12]}>" if filename.endswith(">") else filename
    linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
    return compile(source, name, "exec")


def short_error(error: BaseException, limit: int = 2000) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_traceback(error: BaseException, limit: int = 4000) -> str:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return text[-limit:]


def is_cuda_fatal(error: BaseException | str) -> bool:
    """After these the CUDA context is unusable: the child must stop."""
    text = str(error).lower()
    return any(marker in text for marker in (
        "illegal memory access", "misaligned address", "unspecified launch failure", "device-side assert",
        "illegal instruction", "an illegal", "cuda error: launch failure", "uncorrectable ecc",
    ))


def _failure_record(args, kwargs):
    """Where a failed build of exactly these arguments is remembered (inside the submission's own build dir)."""
    import hashlib
    from pathlib import Path

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        return None
    try:
        key = hashlib.sha256(repr((args, sorted(kwargs.items()))).encode()).hexdigest()[:24]
    except Exception:  # noqa: BLE001 - unrepresentable arguments: just build
        return None
    return Path(root) / ".kbverify-failed-builds" / f"{key}.txt"


def _reads_like_machine_failure(text: str) -> bool:
    from kbverify.static import classify_build_error

    return classify_build_error(text) == "toolchain"


def build_error_text(error: BaseException, limit: int = 6000) -> str:
    """A build error's start and its end: the compiler's fatal line (the one that says why) comes last."""
    text = f"{type(error).__name__}: {error}"
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return text[:half] + "\n...\n" + text[-half:]


_BUILD_FLOCK = ".kbverify-build.flock"
_builder_depth = 0
_builder_guard = threading.RLock()  # threads of one process take turns too (the flock is per process)


@contextlib.contextmanager
def _sole_builder(build_directory: str | None):
    """Builds of one submission take turns under an flock, and the one holding it clears torch's `lock` files.

    torch's extension builder marks a build in progress with a `lock` file and waits, without limit, for one it
    finds to go. A worker killed mid-build (its timeout, a cut run) leaves that file behind, and every later
    build of the same submission would then hang until its own timeout: a `timed_out` verdict that is the
    verifier's fault. The flock dies with its process, so under it any `lock` file is such a leftover."""
    global _builder_depth
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    with _builder_guard:
        if root is None or _builder_depth:  # a nested loader already holds it (flock does not nest)
            _builder_depth += 1
            try:
                yield
            finally:
                _builder_depth -= 1
            return
        flock = _take_build_flock(root)
        _builder_depth += 1
        try:
            if flock is not None:
                leftovers = list(Path(root).glob("*/lock"))
                if build_directory:
                    leftovers.append(Path(build_directory) / "lock")
                for leftover in leftovers:
                    try:
                        leftover.unlink(missing_ok=True)
                    except OSError as error:
                        log.warning("could not remove a leftover build lock %s: %s", leftover, error)
            yield
        finally:
            _builder_depth -= 1
            if flock is not None:
                flock.close()  # releases the flock


def _take_build_flock(root: str):
    """The open, flocked file, or None where the cache cannot hold one (read-only, full): the build then goes on
    without it, as torch's own would, rather than failing the submission for the verifier's cache."""
    import fcntl

    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        handle = open(Path(root) / _BUILD_FLOCK, "a")
    except OSError as error:
        log.warning("no build flock in %s: %s", root, error)
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
    except OSError as error:
        handle.close()
        log.warning("no build flock in %s: %s", root, error)
        return None
    return handle


_CPP_EXTENSION = "torch.utils.cpp_extension"


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` whenever the named module has been executed by its own loader: on its first import,
    or on the next attempt if that one failed. A look-up that imports nothing (importlib.util.find_spec) changes
    nothing. One per process, left in sys.meta_path (it answers None for every other name)."""

    def __init__(self, name: str, then) -> None:
        self._name = name
        self._then = then
        self._searching = False

    def find_spec(self, fullname, path, target=None):
        if fullname != self._name or self._searching:
            return None
        self._searching = True  # the other finders are asked below; this one must not answer itself
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._searching = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ThenLoader(spec.loader, self._then)
        return spec


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, loader, then) -> None:
        self._loader = loader
        self._then = then

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)  # a failure propagates and leaves the watches waiting
        self._then(module)


_WAITING_WATCHES: list = []


def _wrap_for_waiting_watches(module) -> None:
    while _WAITING_WATCHES:
        _WAITING_WATCHES.pop(0)._wrap_loaders(module)


_CPP_EXTENSION_IMPORT = _AfterImport(_CPP_EXTENSION, _wrap_for_waiting_watches)


class ExtensionWatch:
    """Wraps torch's native-extension loaders to learn whether a submission's extension built and ran."""

    def __init__(self) -> None:
        self.attempts = 0
        self.built = 0
        self.errors: list[str] = []
        self.calls = 0
        self.build_s = 0.0
        self._originals: dict = {}

    def install(self) -> "ExtensionWatch":
        # Importing cpp_extension costs ~0.1 s on a CPU and ~0.3 s on the GPU hosts (setuptools), paid by every
        # worker even when the submission builds nothing; it cannot be preloaded in the server (sandbox.PRELOAD).
        # So the loaders are wrapped when the submission (or anything it calls) first imports the module.
        module = sys.modules.get(_CPP_EXTENSION)
        if module is not None:
            self._wrap_loaders(module)
            return self
        _WAITING_WATCHES.append(self)  # several wait in install order and nest as if installed one by one
        if _CPP_EXTENSION_IMPORT not in sys.meta_path:
            sys.meta_path.insert(0, _CPP_EXTENSION_IMPORT)
        return self

    def _wrap_loaders(self, cpp_extension) -> None:
        for name in ("load_inline", "load"):
            original = getattr(cpp_extension, name)
            self._originals[name] = original
            setattr(cpp_extension, name, self._wrap_loader(original))

    def _wrap_loader(self, original):
        watch = self

        def loader(*args, **kwargs):
            watch.attempts += 1
            started = time.monotonic()
            failure_file = _failure_record(args, kwargs)
            if failure_file is not None and failure_file.exists():
                message = failure_file.read_text()
                if _reads_like_machine_failure(message):
                    failure_file.unlink(missing_ok=True)  # remembered before machine failures were retried
                else:
                    # The same sources and flags failed before: fail the same way without rerunning the compiler.
                    watch.errors.append(message)
                    raise RuntimeError(message)
            during = _PHASE_NOW[0]
            # a build inside a forward (a JIT extension) keeps the build's bound, not a forward's hang budget
            # (kbverify.hang): say so, and say the forward's phase again once it is done
            building = during.startswith("candidate") and not during.startswith("candidate:build")
            if building:
                announce("candidate:build:inline")
            try:
                with _sole_builder(kwargs.get("build_directory")):
                    module = original(*args, **kwargs)
            except BaseException as error:
                text = build_error_text(error)
                watch.errors.append(text)
                # a failure of the machine (compiler killed, disk full) must be retried, not remembered
                if failure_file is not None and isinstance(error, Exception) and not _reads_like_machine_failure(
                        f"{type(error).__name__}: {error}"):
                    failure_file.parent.mkdir(parents=True, exist_ok=True)
                    failure_file.write_text("cached build failure: " + text)
                raise
            finally:
                watch.build_s += time.monotonic() - started
                if building:
                    announce(during)
            watch.built += 1
            return watch._count_calls(module)

        loader.__wrapped__ = original
        return loader

    def _count_calls(self, module):
        watch = self
        for attr in dir(module):
            if attr.startswith("_"):
                continue
            function = getattr(module, attr)
            if not callable(function) or isinstance(function, type):
                continue

            def counted(*args, __function=function, **kwargs):
                watch.calls += 1
                return __function(*args, **kwargs)

            try:
                setattr(module, attr, counted)
            except (AttributeError, TypeError):
                pass
        return module

    def record(self, namespace: dict | None = None) -> dict:
        return {"attempts": self.attempts, "built": self.built, "errors": self.errors[-3:],
                "calls": self.calls, "build_s": self.build_s, "triton_kernels_run": triton_kernels_run(namespace)}


def triton_kernels_run(namespace: dict | None) -> int | None:
    """How many of the submission's triton kernels were compiled (every launch compiles first, once per
    signature), from the kernels' own caches, after the run: 0 when triton was never imported (a dead import is not
    custom code); None where it cannot be known (no namespace, or a triton that keeps its caches elsewhere)."""
    if "triton" not in sys.modules:
        return 0
    JITFunction = getattr(sys.modules.get("triton.runtime.jit"), "JITFunction", None)
    if namespace is None or JITFunction is None:
        return None
    kernels = []
    for value in namespace.values():
        while not isinstance(value, JITFunction) and hasattr(value, "fn"):  # autotuners, heuristics
            value = value.fn
        if isinstance(value, JITFunction):
            kernels.append(value)
    if not kernels:
        return None  # its kernels, if any, live where the namespace does not show them
    compiled = 0
    for kernel in kernels:
        caches = getattr(kernel, "device_caches", None) or getattr(kernel, "cache", None)
        if not isinstance(caches, dict):
            return None
        compiled += sum(len(c[0] if isinstance(c, tuple) else c) for c in caches.values())
    return compiled


def build_job(payload: dict) -> dict:
    """Execute the submission's module level once so any import-time native build lands in the cache; given the
    task too, also construct ModelNew and run one forward, because many submissions build lazily in there."""
    announce("candidate:build")
    watch = ExtensionWatch().install()
    namespace: dict = {"__name__": "kbverify_submission"}
    task = task_from(payload) if payload.get("task_source") else None
    try:
        if task is not None:
            task_namespace = tasks_module.execute_task(task)
            namespace.update({k: v for k, v in task_namespace.items() if not k.startswith("__")})
        exec(compile_untrusted(payload["submission_source"]), namespace)
        if task is not None and "ModelNew" in namespace:
            device = device_from(payload)
            announce("candidate:build:forward")
            set_seed(42)
            model = namespace["ModelNew"](*to_device(namespace["get_init_inputs"](), device)).to(device)
            with torch.no_grad():
                model(*to_device(namespace["get_inputs"](), device))
            synchronize(device)
        ok, error = True, ""
    except BaseException as exc:  # noqa: BLE001 - any failure of untrusted code is data
        ok, error = False, short_error(exc, 6000)
    return {"ok": ok, "error": error, "extensions": watch.record()}


def probe_job(payload: dict) -> dict:
    """What this worker sees: versions and devices (for provenance and `--device auto`)."""
    available = torch.cuda.is_available()
    cuda_error = None
    if not available and torch.version.cuda:
        try:
            torch.cuda.init()
        except Exception as error:  # noqa: BLE001 - the reason is what the caller needs to see
            cuda_error = short_error(error, 500)
    wants_cuda = payload.get("device", "cpu").startswith("cuda")
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": _cudnn_version(),
        "cuda_available": available,
        "cuda_error": cuda_error,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device_count": torch.cuda.device_count() if available else 0,
        "gpu_name": torch.cuda.get_device_name(0) if available and wants_cuda else None,
    }


def _cudnn_version():
    try:
        return torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except RuntimeError:
        return None


def hidden_job(payload: dict) -> dict:
    """Generate a task's hidden shapes here, not in the parent: generating executes the (untrusted) reference."""
    from kbverify import hidden

    announce("reference:hidden-shapes")
    shapes = hidden.generate_hidden_shapes(task_from(payload))
    return {"shapes": [shape.to_json() for shape in shapes]}
