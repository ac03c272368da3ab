# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=timeout verified=timeout
# why: forward never returns
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        while True:
            pass
