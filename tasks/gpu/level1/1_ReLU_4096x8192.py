import torch
import torch.nn as nn


class Model(nn.Module):
    """
    ReLU on a large signed tensor (memory-bound, reference well above 20 us).
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


batch_size = 4096
dim = 8192


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
