"""The one place that sets TF32. Only the legacy flags are written (torch 2.11 and 2.13 honour them, and
`set_float32_matmul_precision` is the same switch for matmul); writing both spellings makes newer torch refuse to
read either, so reads are guarded and a mixed state is recorded as such."""

from __future__ import annotations

import torch


def set_tf32(*, matmul: bool, cudnn: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn


def _read(getter):
    try:
        return getter()
    except RuntimeError:  # torch refuses reads after the legacy and new APIs were mixed
        return "mixed_api"


def tf32_state() -> dict:
    """The flags as they are now; recorded with verdicts and re-asserted before reference calls."""
    return {
        "matmul": _read(lambda: bool(torch.backends.cuda.matmul.allow_tf32)),
        "cudnn": _read(lambda: bool(torch.backends.cudnn.allow_tf32)),
        "cudnn_enabled": bool(torch.backends.cudnn.enabled),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "float32_matmul_precision": _read(torch.get_float32_matmul_precision),
        # oneDNN: off, a CPU reference's convolutions and matmuls fall back to slower kernels
        "mkldnn_enabled": bool(torch.backends.mkldnn.enabled),
    }


def assert_baseline_flags(flags: dict) -> None:
    """Put back every flag a candidate could have changed to slow the reference down."""
    set_tf32(matmul=flags["matmul"] is True, cudnn=flags["cudnn"] is True)
    torch.backends.cudnn.enabled = flags.get("cudnn_enabled", True)
    torch.backends.cudnn.benchmark = flags.get("cudnn_benchmark", False)
    torch.backends.cudnn.deterministic = flags.get("cudnn_deterministic", False)
    torch.backends.mkldnn.enabled = flags.get("mkldnn_enabled", True)
