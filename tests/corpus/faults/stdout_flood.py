# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: prints 20 MB to stdout on its first call, then computes ReLU correctly; capture must stay bounded and the verdict unaffected
import sys

import torch
import torch.nn as nn

_FLOOD_BYTES = 20 * 1024 * 1024


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._flooded = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._flooded:
            self._flooded = True
            line = "x" * 1023 + "\n"
            sys.stdout.write(line * (_FLOOD_BYTES // len(line)))
            sys.stdout.flush()
        return torch.relu(x)
