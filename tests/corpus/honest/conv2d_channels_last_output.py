# kbverify-test: task=tasks/basic/level1/5_conv_standard_2D_square_input_square_kernel.py
# expect: original=passed verified=passed
# why: the task's convolution run in channels_last memory format: same values, an output whose strides differ from the reference's
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 bias: bool = True):
        super().__init__()
        self.conv2d = nn.Conv2d(in_channels, out_channels, (kernel_size, kernel_size), stride=stride,
                                padding=padding, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.conv2d.weight.contiguous(memory_format=torch.channels_last)
        return torch.nn.functional.conv2d(x.contiguous(memory_format=torch.channels_last), weight, self.conv2d.bias,
                                          self.conv2d.stride, self.conv2d.padding)
