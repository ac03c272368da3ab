# kbverify-test: task=tasks/basic/level1/8_GELU_.py
# expect: original=passed verified=passed
# why: exact GELU written out with erf, the same function F.gelu computes
import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))
