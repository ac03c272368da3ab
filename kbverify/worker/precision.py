"""The one place that sets TF32. Only the legacy flags are written (torch 2.11 and 2.13 honour them, and
`set_float32_matmul_precision` is the same switch for matmul); writing both spellings makes newer torch refuse to
read either, so reads are guarded and a mixed state is recorded as such.

Every flag is read and written through torch's own C functions, taken when this module loads (in the worker
server, before any submission): `torch.backends.cudnn` and friends are module attributes a submission could swap
for an object that reports the flags it wants and ignores writes. These globals are in the tamper snapshot."""

from __future__ import annotations

import torch

_get_matmul_tf32, _set_matmul_tf32 = torch._C._get_cublas_allow_tf32, torch._C._set_cublas_allow_tf32
_get_cudnn_tf32, _set_cudnn_tf32 = torch._C._get_cudnn_allow_tf32, torch._C._set_cudnn_allow_tf32
_get_cudnn_enabled, _set_cudnn_enabled = torch._C._get_cudnn_enabled, torch._C._set_cudnn_enabled
_get_cudnn_benchmark, _set_cudnn_benchmark = torch._C._get_cudnn_benchmark, torch._C._set_cudnn_benchmark
_get_cudnn_deterministic = torch._C._get_cudnn_deterministic
_set_cudnn_deterministic = torch._C._set_cudnn_deterministic
_get_mkldnn_enabled, _set_mkldnn_enabled = torch._C._get_mkldnn_enabled, torch._C._set_mkldnn_enabled
_get_float32_matmul_precision = torch._C._get_float32_matmul_precision


def set_tf32(*, matmul: bool, cudnn: bool) -> None:
    _set_matmul_tf32(matmul)
    _set_cudnn_tf32(cudnn)


def _read(getter):
    try:
        return getter()
    except RuntimeError:  # torch refuses reads after the legacy and new APIs were mixed
        return "mixed_api"


def tf32_state() -> dict:
    """The flags as they are now; recorded with verdicts and re-asserted before reference calls."""
    return {
        "matmul": _read(lambda: bool(_get_matmul_tf32())),
        "cudnn": _read(lambda: bool(_get_cudnn_tf32())),
        "cudnn_enabled": bool(_get_cudnn_enabled()),
        "cudnn_benchmark": bool(_get_cudnn_benchmark()),
        "cudnn_deterministic": bool(_get_cudnn_deterministic()),
        "float32_matmul_precision": _read(_get_float32_matmul_precision),
        # oneDNN: off, a CPU reference's convolutions and matmuls fall back to slower kernels
        "mkldnn_enabled": bool(_get_mkldnn_enabled()),
    }


def assert_baseline_flags(flags: dict) -> None:
    """Put back every flag a candidate could have changed to slow the reference down."""
    set_tf32(matmul=flags["matmul"] is True, cudnn=flags["cudnn"] is True)
    _set_cudnn_enabled(flags.get("cudnn_enabled", True))
    _set_cudnn_benchmark(flags.get("cudnn_benchmark", False))
    _set_cudnn_deterministic(flags.get("cudnn_deterministic", False))
    _set_mkldnn_enabled(flags.get("mkldnn_enabled", True))
