import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Performs a GEMM, Group Normalization and a learnable per-feature scale.
    """

    def __init__(self, in_features, out_features, num_groups, scale_shape):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.group_norm = nn.GroupNorm(num_groups, out_features)
        self.scale = nn.Parameter(torch.ones(scale_shape))

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_features).
        Returns:
            torch.Tensor: Output tensor of shape (batch_size, out_features).
        """
        x = self.gemm(x)
        x = self.group_norm(x)
        x = x * self.scale
        return x


batch_size = 32
in_features = 256
out_features = 128
num_groups = 8
scale_shape = (out_features,)


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, num_groups, scale_shape]
