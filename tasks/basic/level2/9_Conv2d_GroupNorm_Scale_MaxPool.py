import torch
import torch.nn as nn


class Model(nn.Module):
    """
    A convolution, Group Normalization, a learnable per-channel scale, then max pooling.
    """

    def __init__(self, in_channels, out_channels, kernel_size, num_groups, scale_shape, pool_size):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(num_groups, out_channels)
        self.scale = nn.Parameter(torch.ones(scale_shape))
        self.pool = nn.MaxPool2d(kernel_size=pool_size)

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_channels, height, width).
        Returns:
            torch.Tensor: Output tensor of shape (batch_size, out_channels, height', width').
        """
        x = self.conv(x)
        x = self.group_norm(x)
        x = x * self.scale
        x = self.pool(x)
        return x


batch_size = 16
in_channels = 3
out_channels = 16
height, width = 32, 32
kernel_size = 3
num_groups = 4
scale_shape = (out_channels, 1, 1)
pool_size = 2


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups, scale_shape, pool_size]
