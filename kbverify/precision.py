"""The one place that sets TF32: torch 2.11 and 2.13 both honour the legacy flags; newer builds add
`fp32_precision`, which we set too where it exists so the two spellings never disagree."""

from __future__ import annotations

import torch


def set_tf32(*, matmul: bool, cudnn: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn
    torch.set_float32_matmul_precision("high" if matmul else "highest")


def tf32_state() -> dict:
    """The flags as they are now; recorded with verdicts and re-asserted before reference calls."""
    return {
        "matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn": bool(torch.backends.cudnn.allow_tf32),
        "cudnn_enabled": bool(torch.backends.cudnn.enabled),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def assert_baseline_flags(flags: dict) -> None:
    """Put back every flag a candidate could have changed to slow the reference down."""
    set_tf32(matmul=flags["matmul"], cudnn=flags["cudnn"])
    torch.backends.cudnn.enabled = flags.get("cudnn_enabled", True)
    torch.backends.cudnn.benchmark = flags.get("cudnn_benchmark", False)
    torch.backends.cudnn.deterministic = flags.get("cudnn_deterministic", False)
