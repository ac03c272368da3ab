# kbverify-test: task=tasks/gpu/level1/12_ScaleShiftReLU_4096x4096.py
# expect: original=passed verified=passed
# why: honest non-blocking twin of scale_shift_relu_item_check and scale_shift_relu_host_copy: the same epilogue, nothing read back to the host
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(torch.full_like(x, 0.5), x, torch.full_like(x, 2.0)).clamp_min_(0.0)
