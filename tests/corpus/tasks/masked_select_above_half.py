import torch
import torch.nn as nn


class Model(nn.Module):
    """The elements above one half: the output's length follows the input's values, not only its shape."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x):
        return x[x > 0.5]


n = 65536


def get_inputs():
    return [torch.rand(n)]


def get_init_inputs():
    return []
