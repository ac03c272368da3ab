# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=crashed verified=crashed
# why: forward calls os._exit(3), ending the process without any exception to catch
import os

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        os._exit(3)
