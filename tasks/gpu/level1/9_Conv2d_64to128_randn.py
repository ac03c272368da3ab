import torch
import torch.nn as nn


class Model(nn.Module):
    """
    3x3 convolution, 64 to 128 channels, on signed inputs: a TF32 (cuDNN default) result exceeds 1e-3 on x3 and shifted inputs.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch_size = 16
in_channels = 64
out_channels = 128
height = width = 128
kernel_size = 3


def get_inputs():
    x = torch.randn(batch_size, in_channels, height, width)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
