# kbverify-test: task=tasks/basic/level1/10_cumsum.py
# expect: original=passed verified=passed
# why: the scan accumulated in float64 and rounded once: never less accurate than the float32 reference
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x.double(), dim=self.dim).to(x.dtype)
