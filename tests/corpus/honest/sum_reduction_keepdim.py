# kbverify-test: task=tasks/basic/level1/6_Sum_reduction_over_a_dimension.py
# expect: original=passed verified=passed
# why: the reduction as a batched matmul with a ones vector: another summation order, same fp32 result within 1e-3
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        moved = x.movedim(self.dim, -1)
        ones = torch.ones(moved.shape[-1], 1, device=x.device, dtype=x.dtype)
        return torch.matmul(moved, ones).movedim(-1, self.dim)
