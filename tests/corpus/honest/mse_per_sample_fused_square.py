# kbverify-test: task=tasks/basic/level1/9_MSELoss.py
# expect: original=passed verified=passed
# why: per-sample squared error through one multiply of the difference with itself, reduced by mean
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        difference = predictions - targets
        return (difference * difference).mean(dim=1)
