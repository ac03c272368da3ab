# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: honest twin of exploits/relu_first_element_sign: (x + |x|)/2 decides each element by its own sign, exactly (2x and the halving are exact in fp32), so mixed-sign inputs change nothing
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + x.abs()) * 0.5
