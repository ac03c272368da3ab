import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Convolution, Batch Normalization with inference semantics (the running statistics, whatever the module's mode)
    and ReLU: the layer a deployed network runs, which a kernel may fold into the convolution.
    """

    def __init__(self, in_channels, out_channels, kernel_size):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        x = self.conv(x)
        x = F.batch_norm(x, self.bn.running_mean, self.bn.running_var, self.bn.weight, self.bn.bias,
                         training=False, eps=self.bn.eps)
        return torch.relu(x)


batch_size = 8
in_channels = 8
out_channels = 16
height = width = 16
kernel_size = 3


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
