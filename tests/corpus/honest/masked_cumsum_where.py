# kbverify-test: task=tasks/basic/level1/12_cumsum_with_mask.py
# expect: original=passed verified=passed
# why: torch.where on the bool mask instead of multiplying by it; the mask keeps its dtype
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x, mask):
        return torch.cumsum(torch.where(mask, x, torch.zeros((), device=x.device, dtype=x.dtype)), dim=self.dim)
