import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Swaps the last two dimensions. The result is a view of the input (no copy), so a kernel may return a view too.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, rows, cols).

        Returns:
            torch.Tensor: View of shape (batch_size, cols, rows).
        """
        return x.transpose(1, 2)


batch_size = 16
rows = 64
cols = 96


def get_inputs():
    x = torch.rand(batch_size, rows, cols)
    return [x]


def get_init_inputs():
    return []
