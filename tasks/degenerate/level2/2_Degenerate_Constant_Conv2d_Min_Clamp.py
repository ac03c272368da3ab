import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Degenerate on purpose (constant output), like KernelBench level2/83: min(x, 0) is never positive and
    clamp(0, 1) then maps everything to 0.
    """

    def __init__(self, in_channels, out_channels, kernel_size, min_value, max_value):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.min_value = min_value
        self.max_value = max_value

    def forward(self, x):
        x = self.conv(x)
        x = torch.min(x, torch.tensor(self.min_value, device=x.device, dtype=x.dtype))
        x = torch.clamp(x, min=self.min_value, max=self.max_value)
        return x


batch_size = 8
in_channels = 3
out_channels = 16
height = width = 32
kernel_size = 3
min_value = 0.0
max_value = 1.0


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, min_value, max_value]
