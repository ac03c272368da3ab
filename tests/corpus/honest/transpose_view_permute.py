# kbverify-test: task=tasks/basic/level1/15_Transpose_view.py
# expect: original=passed verified=passed
# why: returns a view of the input exactly where the reference does (same shape and strides), which is legal here
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 1)
