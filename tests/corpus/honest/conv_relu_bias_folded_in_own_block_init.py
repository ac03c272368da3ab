# kbverify-test: task=tasks/basic/level2/1_Conv2D_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: the fold happens inside a module class of the submission's own, in that class's __init__, before ModelNew
#   attaches it: relu(2z)/2 = relu(z) exactly, so it is right for whatever weights it is given, which must reach
#   the convolution as it is created, not when ModelNew receives the finished block
import torch
import torch.nn as nn


class DoubledConv(nn.Conv2d):
    def __init__(self, *args):
        super().__init__(*args)
        with torch.no_grad():
            self.weight.mul_(2.0)
            self.bias.mul_(2.0)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = DoubledConv(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return torch.relu(self.conv(x)) * 0.5 + self.bias
