import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features=num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return self.bn(x)
        mean = x.mean(dim=(0, 2, 3), keepdim=True)
        centered = x - mean
        var = (centered * centered).mean(dim=(0, 2, 3), keepdim=True)
        y = centered * torch.rsqrt(var + self.bn.eps)
        return y * self.bn.weight.reshape(1, -1, 1, 1) + self.bn.bias.reshape(1, -1, 1, 1)
