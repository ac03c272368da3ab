"""Whether this machine can build a native extension at all.

A submission's failed build can read like the machine's fault (no compiler, the compiler killed, the disk full),
and that would make it an infrastructure error, never counted against the kernel. But the words are the build's
output, which the submission controls (an `#error No space left on device` prints them), so they are believed
only when a trivial extension, built here in a fresh folder, fails too.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time

from pathlib import Path

from kbverify.harness import confine, sandbox

PROBE_TIMEOUT_S = 600.0  # a CUDA extension's first build on a busy machine
# A probe that built is believed this long: a rescore of GPU kernels on a CPU host would otherwise build one
# (~20 s) for every CUDA submission. A probe that failed is never remembered: the unit is retried anyway.
BUILT_PROBE_TRUSTED_S = 600.0
_built_at: dict[tuple, float] = {}
_built_lock = threading.Lock()
_PER_SUBMISSION = confine.BUILD_FOLDERS  # cache folders: they do not change a compiler

_CPP_PROBE = '''from torch.utils.cpp_extension import load_inline

load_inline(name="kbverify_toolchain_probe", cpp_sources="int kbverify_probe() { return 1; }",
            functions=["kbverify_probe"], verbose=False)
'''

_CUDA_PROBE = '''from torch.utils.cpp_extension import load_inline

load_inline(name="kbverify_toolchain_probe", cpp_sources="int kbverify_probe();",
            cuda_sources="__global__ void kbverify_probe_kernel(int* x) { *x = 1; }\\n"
                         "int kbverify_probe() { return 1; }\\n",
            functions=["kbverify_probe"], verbose=False)
'''


def cannot_build_here(device: str, build_env: dict | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when a trivial extension (CUDA for a GPU device, C++ otherwise) builds on this machine, in the
    environment the submission's build had (`build_env`); else why not.

    The folder is fresh each time: a cached build would load without running a compiler, and a full disk or a
    missing compiler may have come after it was made."""
    source = _CUDA_PROBE if device.startswith("cuda") else _CPP_PROBE
    key = (device, tuple(sorted((k, v) for k, v in (build_env or {}).items() if k not in _PER_SUBMISSION)))
    with _built_lock:
        if time.monotonic() - _built_at.get(key, -BUILT_PROBE_TRUSTED_S) < BUILT_PROBE_TRUSTED_S:
            return None
    with tempfile.TemporaryDirectory(prefix="kbv-probe-") as folder:
        env = {"MAX_JOBS": os.environ.get("MAX_JOBS", str(os.cpu_count() or 1)), **(build_env or {}),
               "TORCH_EXTENSIONS_DIR": folder}
        outcome = sandbox.run_child("build", {"submission_source": source, "device": device},
                                    timeout_s=timeout_s, device=device, env=env)
    result = outcome.result or {}
    if result.get("ok"):
        with _built_lock:
            _built_at[key] = time.monotonic()
        return None
    if outcome.timed_out:
        return f"a trivial extension did not build within {timeout_s:.0f} s"
    return result.get("error") or result.get("infrastructure_error") or f"the probe died (exit {outcome.exit_code})"


def default_build_cache() -> Path:
    return Path(os.environ.get("KBVERIFY_CACHE", Path.home() / ".cache" / "kbverify")) / "builds"


def build_env(submission, options) -> dict:
    """Builds are keyed by the submission's content hash: same-named extensions of two submissions never meet."""
    builds = options.build_cache or default_build_cache()
    builds.mkdir(parents=True, exist_ok=True)
    # closed to other users: a job of its own uid is then let through to its own folders alone (confine), where an
    # open cache showed it every other submission's generated code and compiled kernels
    if builds.stat().st_mode & 0o077 and builds.stat().st_uid == os.geteuid():
        builds.chmod(0o700)
    root = builds / submission.sha256[:20]
    root.mkdir(parents=True, exist_ok=True)
    # inductor's cache too: without it each process of a torch.compile submission compiled it afresh in its own
    # scratch (18 s of a 21 s child on a CPU); kept with the submission's builds, it is only ever its own
    env = {"TORCH_EXTENSIONS_DIR": str(root / "torch_extensions"), "TRITON_CACHE_DIR": str(root / "triton"),
           "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
           "MAX_JOBS": str(options.max_jobs or os.environ.get("MAX_JOBS") or max(1, os.cpu_count() or 1))}
    if not options.device.startswith("cuda"):
        env["TRITON_INTERPRET"] = "1"
    return env


def built_extensions(env: dict) -> dict[str, int]:
    """Each compiled extension (`*.so`) in a submission's TORCH_EXTENSIONS_DIR, by path, and when it was written.

    torch's loader runs ninja in every fresh process, and ninja rewrites nothing that is up to date: the same map
    before and after a build means the build was a cache hit, compiled nothing."""
    root = env.get("TORCH_EXTENSIONS_DIR")
    if not root or not os.path.isdir(root):
        return {}
    stamps = {}
    for path in Path(root).glob("*/*.so"):
        try:
            stamps[str(path)] = path.stat().st_mtime_ns
        except OSError:  # removed meanwhile (another build of the same submission): it is not there
            continue
    return stamps
