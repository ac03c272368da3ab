# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: writes every call's result into one output buffer it keeps (resized when the shape changes) and returns it: the same tensor each time, fully recomputed
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._out = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._out is None or self._out.shape != x.shape or self._out.dtype != x.dtype or self._out.device != x.device:
            self._out = torch.empty_like(x)
        return torch.clamp(x, min=0, out=self._out)
