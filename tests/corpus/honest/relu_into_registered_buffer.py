# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: computes every call's result into a registered (non-persistent) buffer, resized when the shape changes, and returns that buffer
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("out", torch.empty(0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.out.shape != x.shape or self.out.dtype != x.dtype or self.out.device != x.device:
            self.out = torch.empty_like(x)
        return torch.clamp(x, min=0, out=self.out)
