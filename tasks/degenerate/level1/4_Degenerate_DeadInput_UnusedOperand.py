import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Degenerate on purpose (dead input): forward takes `x` and `y` but the output depends on `x` alone.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * 2.0


batch_size = 16
dim = 512


def get_inputs():
    x = torch.rand(batch_size, dim)
    y = torch.rand(batch_size, dim)
    return [x, y]


def get_init_inputs():
    return []
