# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: ReLU as clamp(min=0): a plain-torch rewrite, exact on every sign and scale
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, min=0.0)
