import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Degenerate on purpose (mostly-zero output): ReLU(x - 0.9) on inputs in [0, 1) is exactly zero for about 90% of
    the elements, so far more than 70% of the output lies within atol of 0.
    """

    def __init__(self, threshold: float):
        super(Model, self).__init__()
        self.threshold = threshold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x - self.threshold)


batch_size = 16
dim = 512
threshold = 0.9


def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]


def get_init_inputs():
    return [threshold]
