"""Native builds inside a child: watching torch's extension loaders, and taking turns over a submission's build cache.

`ExtensionWatch` learns whether a submission's extension built and ran; builds of one submission take turns under
an flock (`_sole_builder`), and a failed build is remembered so the same sources and flags fail again without the
compiler. `build_job` runs a submission once so its native builds land in the cache before it is timed.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import logging
import os
import sys
import threading
import time
from pathlib import Path

import torch

from kbverify.core import tasks as tasks_module
from kbverify.worker.worker import (_PHASE_NOW, announce, compile_untrusted, device_from, set_seed, short_error,
                                   synchronize, task_from, to_device)

log = logging.getLogger(__name__)


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
    from kbverify.judge.static import classify_build_error

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
            # (kbverify.harness.hang): say so, and say the forward's phase again once it is done
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
    return {"ok": ok, "error": error, "extensions": watch.record(), "cpu_s": _cpu_s()}


def _cpu_s() -> float:
    """CPU seconds of this process and of the compilers it waited for (ninja and what ninja ran): the build's own
    work, where the machine's busy time would count whatever else runs beside it."""
    import resource

    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime

