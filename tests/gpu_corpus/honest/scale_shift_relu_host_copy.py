# kbverify-test: task=tasks/gpu/level1/12_ScaleShiftReLU_4096x4096.py
# expect: original=passed verified=passed
# why: honest epilogue that copies a few output values to the host (.cpu()) inside forward, e.g. for logging (blocks inside the call)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.addcmul(torch.full_like(x, 0.5), x, torch.full_like(x, 2.0)).clamp_min_(0.0)
        self.last_head = y[0, :8].cpu()  # a device-to-host copy: waits for the kernels before it
        return y
