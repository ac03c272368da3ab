# kbverify-test: task=tasks/gpu/level1/12_ScaleShiftReLU_4096x4096.py
# expect: original=passed verified=passed
# why: honest in-place epilogue with a NaN check read by .item() in Python (blocks inside the call: timed in sync mode)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.addcmul(torch.full_like(x, 0.5), x, torch.full_like(x, 2.0)).clamp_min_(0.0)
        if torch.isnan(y).any().item():  # the host waits for every kernel so far
            raise ValueError("NaN in the output")
        return y
