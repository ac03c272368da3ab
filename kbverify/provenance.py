"""Where a verdict was made: machine, software, versions. The compatibility key decides what may be merged."""

from __future__ import annotations

import functools
import platform
import shutil
import subprocess
from pathlib import Path

import kbverify

COMPAT_FIELDS = ("gpu_model", "driver", "cuda", "torch")


def collect(device: str) -> dict:
    """Versions come from a worker (the parent never imports torch): the last one that ran on `device`, or a
    probe; the GPU's identity from nvidia-smi."""
    from kbverify.sandbox import last_worker_info

    return _collect(device, tuple(sorted((last_worker_info(device) or {}).items())))


@functools.lru_cache(maxsize=8)
def _collect(device: str, reported: tuple) -> dict:
    from kbverify.sandbox import run_child

    probe = dict(reported) or run_child("probe", {"device": device}, timeout_s=120, device=device).result or {}
    info = {
        "kbverify": kbverify.__version__,
        "kbverify_commit": _git_commit(),
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


def compat_key(info: dict) -> str:
    return "|".join(f"{field}={info.get(field)}" for field in COMPAT_FIELDS)


def _nvidia_smi() -> dict:
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


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
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
