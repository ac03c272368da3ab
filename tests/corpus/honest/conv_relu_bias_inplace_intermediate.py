# kbverify-test: task=tasks/basic/level2/1_Conv2D_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: in-place ReLU and bias add on the kernel's own intermediate (never on the input), same parameters
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        y = F.conv2d(x, self.conv.weight, self.conv.bias)
        return y.relu_().add_(self.bias)
