# kbverify-test: task=tasks/basic/level1/6_Sum_reduction_over_a_dimension.py
# expect: original=passed verified=passed
# why: accumulates in float64 and rounds once: more accurate than the float32 reference, never less
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double().sum(dim=self.dim, keepdim=True).to(x.dtype)
