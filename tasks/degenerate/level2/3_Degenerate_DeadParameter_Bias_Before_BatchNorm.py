import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Degenerate on purpose (dead parameter): `self.bias` is added before a training-mode BatchNorm, which subtracts
    the batch mean per feature and so removes any per-feature constant. The bias never influences the output
    (beyond rounding), and neither does the Linear layer's own bias.
    """

    def __init__(self, in_features, out_features, bias_shape):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.bn = nn.BatchNorm1d(out_features)

    def forward(self, x):
        x = self.gemm(x)
        x = x + self.bias
        x = self.bn(x)
        x = torch.relu(x)
        return x


batch_size = 32
in_features = 256
out_features = 128
bias_shape = (out_features,)


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, bias_shape]
