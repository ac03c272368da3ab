# kbverify-test: task=tasks/basic/level1/2_Square_matrix_multiplication_.py
# expect: original=passed verified=passed
# why: honest twin of the kernels that rewrite the timing worker's sides: it walks f_back to the batch loop and only reads what it finds there (the side names and the reference model's class), then computes the product
import sys

import torch
import torch.nn as nn

_first_frame = getattr(sys, "_get" + "frame")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = set()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        frame = _first_frame(0)
        while frame is not None:
            sides = frame.f_locals.get("sides") if frame.f_code.co_name == "_serve_batches" else None
            if isinstance(sides, dict):
                self.seen.update(f"{name}:{type(side.model).__name__}" for name, side in sides.items())
            frame = frame.f_back
        return torch.matmul(A, B)
