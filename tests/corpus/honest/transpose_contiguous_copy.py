# kbverify-test: task=tasks/basic/level1/15_Transpose_view.py
# expect: original=passed verified=passed
# why: the reference returns a view of its input; this returns a fresh contiguous copy with the same values (no aliasing, no mutation)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).contiguous()
