# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: ReLU as where(x > 0, x, 0): a fresh output, exact on every sign (zeros and negatives alike)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, x, torch.zeros((), dtype=x.dtype, device=x.device))
