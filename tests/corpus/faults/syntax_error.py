# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=compile_error verified=compile_error
# why: the file does not parse
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x
