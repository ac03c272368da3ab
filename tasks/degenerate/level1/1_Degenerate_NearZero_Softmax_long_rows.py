import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Degenerate on purpose (near-zero output): softmax over rows of 8192 values in [0, 1). Every output is about
    1/8192 ~ 1.2e-4, so returning zeros passes allclose(atol=1e-2), as with KernelBench level1/23.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


batch_size = 16
dim = 8192


def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
