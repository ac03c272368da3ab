import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x):
        # Scan in place to avoid allocating an output buffer.
        return x.cumsum_(dim=self.dim)
