"""Where a verdict was made: machine, software, versions. The compatibility key decides what may be merged."""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import platform
import shutil
import subprocess
import threading
from pathlib import Path

import kbverify

COMPAT_FIELDS = ("gpu_model", "driver", "cuda", "torch")


def collect(device: str) -> dict:
    """Versions come from a probe worker, once per device (the parent never imports torch), and the GPU's identity
    from nvidia-smi. Never from a worker that ran submission code, which can make torch say anything, nor from
    one that ran a task's code (a published run's reference is untrusted too): the probe runs neither."""
    with _probe_lock:
        if device not in _collected:
            info = _collect(device)
            if info.get("torch") is None:
                return info  # a probe that failed is asked again next time, not remembered
            _collected[device] = info
        return dict(_collected[device])


_collected: dict[str, dict] = {}
_probe_lock = threading.Lock()


def _collect(device: str) -> dict:
    from kbverify.harness.sandbox import run_child

    probe = run_child("probe", {"device": device}, timeout_s=120, device=device).result or {}
    info = {
        "kbverify": kbverify.__version__,
        "kbverify_commit": _git_commit(),
        # The code that ran, whatever git says: a copied checkout can carry a .git that lags its files.
        "kbverify_source_sha256": source_sha256(),
        "python": platform.python_version(),
        "torch": probe.get("torch"),
        "cuda": probe.get("cuda"),
        "cudnn": probe.get("cudnn"),
        "cuda_available": probe.get("cuda_available"),
        "gpu_name": probe.get("gpu_name"),
        "triton": _version("triton"),
        "host_cpu": platform.processor() or platform.machine(),
        "device": device,
        "gpu_model": None,
        "gpu_uuid": None,
        "driver": None,
    }
    if device.startswith("cuda"):
        info.update(_nvidia_smi())
        info["gpu_model"] = info["gpu_model"] or probe.get("gpu_name")
    return info


_smi_lock = threading.Lock()
_smi_pending: concurrent.futures.Future | None = None


def prefetch(device: str) -> None:
    """Ask nvidia-smi now, in the background: it takes a good part of a second, which then overlaps with the
    workers' start instead of adding to every verdict's wall time."""
    global _smi_pending
    if not device.startswith("cuda"):
        return
    with _smi_lock:
        if _smi_pending is None:
            _smi_pending = concurrent.futures.Future()
            threading.Thread(target=_fill, args=(_smi_pending,), daemon=True, name="kbverify-nvidia-smi").start()


def _fill(future: concurrent.futures.Future) -> None:
    try:
        future.set_result(_query_nvidia_smi())
    except BaseException as error:  # noqa: BLE001 - provenance is best effort; the waiter gets {}
        future.set_exception(error)


def _nvidia_smi() -> dict:
    prefetch("cuda")
    try:
        return dict(_smi_pending.result(timeout=30))
    except Exception:  # noqa: BLE001
        return {}


def gpu_model() -> str | None:
    """The first GPU's name as nvidia-smi gives it (the name torch reports), or None when it cannot say."""
    return _nvidia_smi().get("gpu_model") or None


def compat_key(info: dict) -> str:
    return "|".join(f"{field}={info.get(field)}" for field in COMPAT_FIELDS)


def _query_nvidia_smi() -> dict:
    if not shutil.which("nvidia-smi"):
        return {}
    try:
        line = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm",
             "--format=csv,noheader", "-i", "0"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return {}
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 3:
        return {}
    return {"gpu_model": parts[0], "gpu_uuid": parts[1], "driver": parts[2],
            "sm_clock_mhz_at_start": parts[3] if len(parts) > 3 else None,
            "sm_clock_max_mhz": parts[4] if len(parts) > 4 else None}


@functools.lru_cache(maxsize=1)
def source_sha256() -> str:
    """One hash over the package's Python sources and bundled data, by relative path and content."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.is_file() and p.suffix in (".py", ".json")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists() or not shutil.which("git"):
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001 - not installed
        return None
