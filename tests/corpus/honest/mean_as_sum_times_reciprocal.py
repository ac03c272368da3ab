# kbverify-test: task=tasks/basic/level1/7_Mean_reduction_over_a_dimension.py
# expect: original=passed verified=passed
# why: mean as a sum scaled by 1/n (one rounding more than torch.mean), any reduced length
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=self.dim) * (1.0 / x.shape[self.dim])
