# kbverify-test: task=tasks/basic/level1/2_Square_matrix_multiplication_.py
# expect: original=passed verified=passed
# max-speedup: verified=1.3
# budget: verified=2
# why: twin of exploits/matmul_divides_recorded_times.py and the gc-callback shrinkers: walks f_back from its forward to the batch loop and reads (never writes) the times recorded so far, as an autotuner that watched its own calls might, then runs a plain torch.matmul: reading the harness's state is not an offence, and the worker's own times stand (~1x)
import sys

import torch
import torch.nn as nn

_first_frame = getattr(sys, "_get" + "frame")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.seen_ms: list = []

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        frame = _first_frame(1)
        while frame is not None and frame.f_code.co_name != "_calls":
            frame = frame.f_back
        times = frame.f_locals.get("times") if frame is not None else None
        if isinstance(times, list) and times:
            self.seen_ms = [float(t) for t in times][-8:]
        return torch.matmul(A, B)
