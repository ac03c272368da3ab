# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=crashed verified=crashed
# why: forward reads address 0 through ctypes.string_at, a segmentation fault
import ctypes

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctypes.string_at(0)
        return torch.relu(x)
