import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Softmax over long rows of non-negative inputs (KernelBench level1/23 sizes): every output is about 1e-4, so zeros pass an element-wise 1e-3 check.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


batch_size = 16
dim = 16384


def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
