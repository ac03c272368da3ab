# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: imports torch._dynamo (as torch.compile does), which replaces torch.manual_seed with torch's own wrapper of it; not a harness change
import torch
import torch._dynamo  # noqa: F401
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, min=0.0)
