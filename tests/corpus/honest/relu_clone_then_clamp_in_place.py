# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: honest twin of relu_identity_when_timed: a copy of the input clamped in place, the same work on every call, timed or checked, whatever the input's signs
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone().clamp_min_(0.0)
